"""Training per-step tasks end to end: repeat copy with the DNC, LSTM and RMC; the DNC on Nth
Farthest; exact resume; ``relmem eval`` / ``plot`` on a repeat-copy run; CLI errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from relmem import cli
from relmem.tasks import get_task
from relmem.train import checkpoint as ckpt_io
from relmem.train.evaluation import evaluate
from relmem.train.loop import run
from relmem.train.metrics import read_metrics
from relmem.train.runs import build_model, load_run_config

TINY_CLI = [
    "--device", "cpu", "--steps", "40", "--batch-size", "16", "--eval-every", "20",
    "--eval-batch", "32", "--log-every", "10", "--checkpoint-every", "20",
    "--task.test-size", "64", "--dnc.hidden-size", "16", "--dnc.memory-size", "8",
    "--dnc.word-size", "8", "--dnc.num-read-heads", "2", "--optim.lr", "1e-2", "--no-tensorboard",
]  # fmt: skip


def train_losses(run_dir: Path) -> list[float]:
    return [r["train/loss"] for r in read_metrics(run_dir / "metrics.jsonl") if "train/loss" in r]


def test_cli_repeat_copy_dnc_writes_a_complete_run(tmp_path: Path, capsys) -> None:
    args = ["train", "repeat-copy", "--model", "dnc", *TINY_CLI, "--out-dir", str(tmp_path)]
    assert cli.main([*args, "--run-name", "cli"]) == 0
    run_dir = tmp_path / "cli"
    assert "held-out bit errors per sequence" in capsys.readouterr().out
    task_name, config = load_run_config(run_dir)
    assert task_name == "repeat-copy" and config.model == "dnc"
    assert (config.dnc.hidden_size, config.optim.grad_clip) == (16, 50.0)  # preset + overrides
    assert json.loads((run_dir / "run.json").read_text())["invocations"][0]["argv"][2:4] == [
        "repeat-copy",
        "--model",
    ]
    records = read_metrics(run_dir / "metrics.jsonl")
    keys = set().union(*records)
    assert {"train/bit_errors", "eval/bit_errors", "eval/best_batch_bit_errors"} <= keys
    assert {f"eval/bit_errors_group_{g}" for g in range(4)} <= keys  # (ℓ, k) in {1, 2}²
    assert not any("accuracy" in key for key in keys)
    losses = train_losses(run_dir)
    assert len(losses) == 4 and losses[-1] < losses[0], losses
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["metric"] == "bit_errors"
    assert summary["held_out_bit_errors"] == records[-1]["eval/bit_errors"]
    batch_values = [r["eval/batch_bit_errors"] for r in records if "eval/batch_bit_errors" in r]
    assert summary["best_batch_bit_errors"] == min(batch_values)  # lower is better
    assert ckpt_io.resolve_checkpoint(run_dir).name == "step-00000040"


@pytest.mark.parametrize("model", ["dnc", "lstm", "rmc"])
def test_models_learn_repeat_copy(tiny_copy, model: str, device: torch.device) -> None:
    config = tiny_copy(model=model, steps=150, log_every=25, eval_every=150, device=device.type)
    result = run(config, "repeat-copy")
    assert result.status == "completed"
    losses = train_losses(result.run_dir)
    assert len(losses) == 6
    assert losses[-1] < 0.8 * losses[0], losses  # from about 10 (first 25 steps)
    assert 0 <= result.summary["held_out_bit_errors"] < 4.5  # about 5.7 in the first 25 steps


def test_dnc_on_nth_farthest(tiny) -> None:
    result = run(tiny(model="dnc", steps=20), "nth-farthest")
    assert result.status == "completed" and result.summary["metric"] == "accuracy"
    assert 0.0 <= result.summary["held_out_accuracy"] <= 1.0
    records = read_metrics(result.run_dir / "metrics.jsonl")
    assert "eval/accuracy_group_0" in set().union(*records)
    losses = train_losses(result.run_dir)
    assert losses[-1] < losses[0], losses


def test_dnc_resume_is_exact(tiny_copy, tmp_path: Path) -> None:
    """k steps, checkpoint, resume, k more == 2k steps uninterrupted, bit for bit (CPU)."""
    run(tiny_copy(run_name="straight", steps=20), "repeat-copy")
    run(tiny_copy(run_name="split", steps=10), "repeat-copy")
    result = run(tiny_copy(run_name="split", steps=20, resume=tmp_path / "split"), "repeat-copy")
    assert result.summary["steps"] == 20
    a = load_file(ckpt_io.resolve_checkpoint(tmp_path / "straight") / ckpt_io.MODEL_FILE)
    b = load_file(ckpt_io.resolve_checkpoint(tmp_path / "split") / ckpt_io.MODEL_FILE)
    assert a.keys() == b.keys() and any(name.startswith("core.cell.memory") for name in a)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    sa = ckpt_io.load_train_state(ckpt_io.resolve_checkpoint(tmp_path / "straight"))
    sb = ckpt_io.load_train_state(ckpt_io.resolve_checkpoint(tmp_path / "split"))
    assert sa["best_batch_bit_errors"] == sb["best_batch_bit_errors"]
    first = json.loads((tmp_path / "straight" / "summary.json").read_text())
    assert first["held_out_bit_errors"] == result.summary["held_out_bit_errors"]


@pytest.mark.parametrize("model", ["dnc", "lstm"])
def test_evaluation_does_not_depend_on_chunking(tiny_copy, model: str) -> None:
    """Chunks are trimmed to their longest sequence; padding must not change any result."""
    config = tiny_copy(model=model)
    task = get_task("repeat-copy").build(config.task)
    model_ = build_model(config, task)
    held_out = task.held_out(torch.device("cpu"))
    whole = evaluate(model_, task, held_out)
    chunked = evaluate(model_, task, held_out, chunk=7)
    assert whole["bit_errors"] == chunked["bit_errors"] and whole["groups"] == chunked["groups"]
    assert whole["loss"] == pytest.approx(chunked["loss"], rel=1e-6)


def test_eval_and_plot_on_a_repeat_copy_run(tiny_copy, tmp_path: Path, capsys) -> None:
    result = run(tiny_copy(steps=10), "repeat-copy")
    capsys.readouterr()
    assert cli.main(["eval", str(tmp_path / "run"), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "held-out bit errors per sequence" in out and "by pattern length and repeats" in out
    assert "length 2, repeats 2" in out
    record = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert record["metric"] == "bit_errors" and record["count"] == 64
    assert record["bit_errors"] == result.summary["held_out_bit_errors"]
    assert set(record["groups"]) <= {"0", "1", "2", "3"}
    out_json = tmp_path / "small.json"
    assert (
        cli.main(["eval", str(tmp_path / "run"), "--test-size", "16", "--json-out", str(out_json)])
        == 0
    )
    assert json.loads(out_json.read_text())["count"] == 16
    capsys.readouterr()
    assert cli.main(["plot", str(tmp_path / "run")]) == 0
    assert "no attention maps" in capsys.readouterr().out
    plots = tmp_path / "run" / "plots"
    assert (plots / "curves.png").stat().st_size > 0
    assert not list(plots.glob("attention_*"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["repeat-copy", "--task.num-bits", "0"], "task.num_bits must be >= 1, got 0"),
        (["repeat-copy", "--task.min-repeats", "3"], "task.min_repeats (3) must be <= task.max_"),
        (["copy", "--task.max-length", "0"], "task.max_length must be >= 1"),
        (["associative-recall", "--task.min-items", "1"], "task.min_items must be >= 2"),
        (["repeat-copy", "--dnc.memory-size", "0"], "dnc.memory_size must be >= 1"),
        (["nth-farthest", "--model", "dnc", "--dnc.clip-value", "-1"], "dnc.clip_value must be"),
        (["repeat-copy", "--preset", "paper"], "unknown preset 'paper' for task 'repeat-copy'"),
        (["nth-farthest", "--preset", "repeat_copy_cpu"], "unknown preset 'repeat_copy_cpu'"),
    ],
)
def test_bad_values_for_the_new_options(args: list[str], message: str, capsys, tmp_path: Path):
    code = cli.main(["train", *args, "--out-dir", str(tmp_path)])
    assert code == 2
    assert message in " ".join(capsys.readouterr().err.split())
    assert not list(tmp_path.iterdir())  # nothing was written


@pytest.mark.parametrize(
    "args", [["repeat-copy", "--dnc.compat", "sonnet"], ["copy", "--task.num-bits", "many"]]
)
def test_malformed_new_options_exit_2(args: list[str], capsys) -> None:
    assert cli.main(["train", *args]) == 2
    assert args[1] in capsys.readouterr().err


def test_help_lists_the_new_tasks_and_options(capsys) -> None:
    assert cli.main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("copy", "repeat-copy", "associative-recall"))
    assert cli.main(["train", "repeat-copy", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--dnc.memory-size" in out and "--task.max-repeats" in out
