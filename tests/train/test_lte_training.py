"""Learning to Execute through the trainer: tiny runs of every core, the curriculum stepped by
the trainer's after-evaluation hook (it advances while the loss falls), and an exact resume
with the curriculum's state in the checkpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from relmem import cli
from relmem.commands.train import parse
from relmem.tasks.learn_to_execute import LearnToExecuteConfig
from relmem.train import checkpoint as ckpt_io
from relmem.train.config import OptimConfig, TrainConfig
from relmem.train.loop import run
from relmem.train.metrics import read_metrics


def lte(tiny, task: dict[str, Any] | None = None, **overrides: Any) -> TrainConfig:
    """``tiny(...)`` on addition at L=2, N=1 with a 64-program held-out set, Adam 1e-2, one
    thread."""
    settings = {"task_type": "addition", "max_length": 2, "max_nesting": 1, "test_size": 64}
    config = tiny(
        task=LearnToExecuteConfig(**(settings | (task or {}))), eval_batch=32, cpu_threads=1
    )
    config.optim = OptimConfig(lr=1e-2, grad_clip=1.0)
    for name, value in overrides.items():
        setattr(config, name, value)
    return config


@pytest.mark.parametrize("model", ["rmc", "lstm", "dnc"])
def test_tiny_run_of_every_core(tiny, model: str, device: torch.device) -> None:
    task = {"task_type": "control", "max_nesting": 2}
    config = lte(tiny, task, model=model, steps=10, eval_every=5, device=device.type)
    result = run(config, "lte")
    assert result.status == "completed"
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["steps"] == 10 and summary["metric"] == "accuracy"
    assert 0.0 <= summary["held_out_accuracy"] <= 1.0
    assert 0.0 <= summary["held_out_solved"] <= 1.0
    last = read_metrics(result.run_dir / "metrics.jsonl")[-1]
    for key in ("train/solved", "eval/solved", "eval/accuracy"):
        assert 0.0 <= last[key] <= 1.0, key
    assert (last["curriculum/length"], last["curriculum/nesting"]) == (2.0, 2.0)  # mix: its range


def test_the_curriculum_advances_in_a_run_whose_loss_falls(tiny) -> None:
    task = {"max_length": 4, "curriculum": "naive", "min_tries": 2}
    result = run(lte(tiny, task, model="lstm", steps=60, eval_every=5, log_every=5), "lte")
    evals = [r for r in read_metrics(result.run_dir / "metrics.jsonl") if "eval/loss" in r]
    losses = [r["eval/loss"] for r in evals]
    levels = [r["curriculum/length"] for r in evals]
    assert losses[-1] < losses[0], losses
    assert levels == sorted(levels) and levels[0] == 1.0 and levels[-1] > 1.0, levels
    saved = ckpt_io.load_train_state(ckpt_io.resolve_checkpoint(result.run_dir))
    assert saved["task_state"]["curriculum"]["length"] == levels[-1]


@pytest.mark.parametrize("split", [15, 17], ids=["on-the-grids", "off-the-grids"])
def test_resume_with_a_moving_curriculum_is_exact(tiny, tmp_path: Path, split: int) -> None:
    """30 steps straight, or ``split`` steps and a resume to 30: the same weights, curriculum
    and records. A first leg ending off the eval grid (17) fed its last evaluation to the
    curriculum, which then moved earlier than in the straight run; off the log grid it closed
    the training window early."""
    task = {"max_length": 3, "curriculum": "combine", "min_tries": 2}
    run(lte(tiny, task, model="lstm", run_name="straight", steps=30, eval_every=5), "lte")
    run(lte(tiny, task, model="lstm", run_name="split", steps=split, eval_every=5), "lte")
    resumed = lte(tiny, task, model="lstm", run_name="split", steps=30, eval_every=5)
    resumed.resume = tmp_path / "split"
    run(resumed, "lte")
    states = [
        ckpt_io.load_train_state(ckpt_io.resolve_checkpoint(tmp_path / name))
        for name in ("straight", "split")
    ]
    assert states[0]["task_state"] == states[1]["task_state"]
    assert states[0]["task_state"]["curriculum"]["length"] > 1
    wa, wb = (
        load_file(ckpt_io.resolve_checkpoint(tmp_path / name) / ckpt_io.MODEL_FILE)
        for name in ("straight", "split")
    )
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    wall_clock = {"time_s", "perf/sequences_per_s", "perf/tokens_per_s"}
    straight, resumed_records = (
        [{k: v for k, v in r.items() if k not in wall_clock} for r in read_metrics(path)]
        for path in (tmp_path / "straight" / "metrics.jsonl", tmp_path / "split" / "metrics.jsonl")
    )
    assert resumed_records == straight


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--task.task-type", "division"], "--task.task-type"),
        (["--task.max-length", "0"], "task.max_length must be >= 1, got 0"),
        (
            ["--task.task-type", "copy", "--task.max-nesting", "4"],
            "task.max_nesting must be 1 for the memorisation task 'copy', got 4",
        ),
        (["--task.curriculum", "naive", "--task.min-tries", "0"], "task.min_tries must be >= 1"),
    ],
)
def test_bad_lte_options_exit_2_naming_the_option(args, message, capsys, tmp_path) -> None:
    assert cli.main(["train", "lte", *args, "--out-dir", str(tmp_path)]) == 2
    assert message in " ".join(capsys.readouterr().err.split())
    assert not list(tmp_path.iterdir())


def test_eval_breaks_down_by_length_and_nesting_and_plot_draws(tiny, tmp_path, capsys) -> None:
    task = {"max_nesting": 2, "breakdown_size": 8}
    run(lte(tiny, task, model="lstm", steps=5, eval_every=5, checkpoint_every=5), "lte")
    capsys.readouterr()
    assert cli.main(["eval", str(tmp_path / "run"), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "held-out per-character accuracy" in out and "held-out solved rate" in out
    assert "length 2, nesting 2" in out and "(32 other sequences)" in out
    record = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert record["count"] == 64 and set(record["breakdown"]["groups"]) == {"0", "1", "2", "3"}
    assert cli.main(["plot", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "plots" / "curves.png").stat().st_size > 0


def test_the_issue_s_command_line_picks_the_sub_task() -> None:
    for flag in ("--task", "--task.task-type"):
        task_name, config, _ = parse(["lte", flag, "control", "--model", "lstm"])
        assert (task_name, config.task.task_type, config.model) == ("lte", "control", "lstm")
