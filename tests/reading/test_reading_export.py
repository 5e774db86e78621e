"""``relmem export`` of a reading run (``relmem train squad`` on the sample): the reader loads
back bit-identically with ``relmem.load_pretrained`` (its pretrained-vector initialiser is not
part of the folder: the weights are), and ``relmem eval`` and ``relmem answer`` read the folder
as they read the run."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from reading_sample import train_args
from safetensors.torch import load_file

import relmem
from relmem import cli
from relmem.train import checkpoint as ckpt_io


def test_a_reader_round_trips(squad_dir: Path, tmp_path: Path, capsys) -> None:
    assert cli.main(train_args(squad_dir, tmp_path, "run")) == 0
    run_dir, out = tmp_path / "run", tmp_path / "reader"
    assert cli.main(["export", str(run_dir), str(out)]) == 0
    assert (out / "data.json").read_text() == (run_dir / "data.json").read_text()
    config = json.loads((out / "config.json").read_text())
    assert config["spec"]["options"]["reader"]["type"] == "ReaderOptions"
    assert config["task"]["data_dir"] == "squad"  # its name: the user points it at their copy
    config["task"]["data_dir"] = str(squad_dir)
    (out / "config.json").write_text(json.dumps(config))

    model, vocabulary, task_name, _ = relmem.load_pretrained(out)
    assert task_name == "squad"
    assert vocabulary["words"][:2] == ["<pad>", "<unk>"] and "lighthouse" in vocabulary["words"]
    best = ckpt_io.best_checkpoint(run_dir) or ckpt_io.resolve_checkpoint(run_dir)
    state = model.state_dict()
    for name, tensor in load_file(str(best / "model.safetensors")).items():
        assert torch.equal(state[name], tensor), name

    records = []
    for target in (run_dir, out):
        json_out = tmp_path / f"{target.name}.json"
        assert cli.main(["eval", str(target), "--json-out", str(json_out)]) == 0
        records.append(json.loads(json_out.read_text()))
    assert records[0]["f1"] == records[1]["f1"] and records[0]["loss"] == records[1]["loss"]

    context = tmp_path / "notes.txt"
    context.write_text("Karl von Frisch decoded the dance.")
    capsys.readouterr()
    ask = ["--context", str(context), "--question", "Who?"]
    assert cli.main(["answer", str(run_dir), *ask]) == 0
    from_run = capsys.readouterr().out
    # the folder answers without the training file: its vocab.json is the vocabulary
    (squad_dir / "train-v1.1.json").rename(tmp_path / "moved.json")
    assert cli.main(["answer", str(out), *ask]) == 0
    assert capsys.readouterr().out == from_run and "Q: " in from_run
