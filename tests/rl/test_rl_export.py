"""``relmem export`` of an RL run (the stand-in game of ``rl_standins``): the agent loads
back bit-identically with ``relmem.load_pretrained``, and ``relmem eval`` and ``play`` read the
folder as they read the run."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from test_rl_training import reach_config, reach_task  # noqa: F401 (a fixture)

import relmem
from relmem import cli
from relmem.train import checkpoint as ckpt_io
from relmem.train.loop import run


def test_an_agent_round_trips(reach_task, tmp_path: Path, capsys) -> None:  # noqa: F811
    run_dir = run(reach_config(tmp_path, steps=4, eval_every=2), "reach").run_dir
    out = tmp_path / "agent"
    assert cli.main(["export", str(run_dir), str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md",
        "config.json",
        "meta.json",
        "model.safetensors",
    ]
    assert json.loads((out / "config.json").read_text())["spec"] is None  # the game builds it

    agent, vocabulary, task_name, config = relmem.load_pretrained(out)
    assert (vocabulary, task_name, config.model) == (None, "reach", "lstm")
    best = ckpt_io.best_checkpoint(run_dir) or ckpt_io.resolve_checkpoint(run_dir)
    state = agent.state_dict()
    for name, tensor in load_file(str(best / "model.safetensors")).items():
        assert torch.equal(state[name], tensor), name

    records = []
    for target in (run_dir, out):
        json_out = tmp_path / f"{target.name}.json"
        assert cli.main(["eval", str(target), "--episodes", "8", "--json-out", str(json_out)]) == 0
        records.append(json.loads(json_out.read_text()))
    assert records[0]["agent"] == records[1]["agent"] and records[0]["step"] == records[1]["step"]
    card = (out / "README.md").read_text()
    assert "levels solved" in card and "relmem eval agent" in card

    gif = tmp_path / "play.gif"
    assert cli.main(["play", str(out), "--out", str(gif)]) == 0
    assert gif.read_bytes()[:3] == b"GIF"
