"""End-to-end training on tiny sizes: learning, exact resume, signals, damage, divergence."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from relmem.tasks.base import Measure
from relmem.tasks.nth_farthest import NthFarthest, NthFarthestConfig
from relmem.tasks.registry import registered
from relmem.train import checkpoint as ckpt_io
from relmem.train.config import OptimConfig, TrainConfig, config_from_dict, config_to_dict
from relmem.train.distributed import DistInfo
from relmem.train.loop import EXIT_DIVERGED, run
from relmem.train.metrics import read_metrics
from relmem.train.runs import load_run_config, load_trained
from relmem.train.trainer import Progress, Trainer, lr_multiplier

SRC = str(Path(__file__).resolve().parents[2] / "src")


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(ckpt_io.resolve_checkpoint(run_dir) / ckpt_io.MODEL_FILE)


@pytest.mark.parametrize("bf16", [False, pytest.param(True, marks=pytest.mark.gpu)])
@pytest.mark.parametrize("model", ["rmc", "lstm"])
def test_tiny_run_learns(tiny, model: str, device: torch.device, bf16: bool) -> None:
    if bf16 and device.type != "cuda":
        pytest.skip("bf16 autocast trains on CUDA only (elsewhere it is refused: test_cli)")
    config = tiny(model=model, steps=60, log_every=10, eval_every=30, checkpoint_every=30)
    config.device, config.bf16 = device.type, bf16
    config.optim.lr = 1e-2
    result = run(config, "nth-farthest")
    assert result.status == "completed" and result.exit_code == 0
    losses = [
        r["train/loss"] for r in read_metrics(result.run_dir / "metrics.jsonl") if "train/loss" in r
    ]
    assert len(losses) == 6
    assert losses[-1] < losses[0] - 0.05, losses  # from ln 4 = 1.386 towards the 50% plateau
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["steps"] == 60 and 0.0 <= summary["held_out_accuracy"] <= 1.0
    for name in ("config.json", "run.json", "metrics.jsonl"):
        assert (result.run_dir / name).is_file()
    task_name, reloaded = load_run_config(result.run_dir)
    assert task_name == "nth-farthest" and reloaded == config


def test_rmc_implementation_reaches_the_core(tiny) -> None:
    """``--rmc.implementation fused`` trains the same function as 'fast', to float rounding."""
    losses = {}
    for implementation in ("fast", "fused"):
        config = tiny(steps=10, log_every=5, run_name=implementation, cpu_threads=1)
        config.rmc.implementation = implementation
        result = run(config, "nth-farthest")
        records = read_metrics(result.run_dir / "metrics.jsonl")
        losses[implementation] = [r["train/loss"] for r in records if "train/loss" in r]
        model = load_trained(result.run_dir)[3]
        assert model.core.implementation == implementation
    assert len(losses["fast"]) == 2
    assert losses["fused"] == pytest.approx(losses["fast"], rel=1e-4)


def test_a_cpu_run_gives_auto_cores_the_fused_step(tiny) -> None:
    """'auto' (the default) trains on the fused step on the CPU; an explicit choice is kept."""
    for implementation, expected in (("auto", "fused"), ("fast", "fast")):
        config = tiny(run_name=implementation)
        config.rmc.implementation = implementation
        trainer = Trainer(config, "nth-farthest", DistInfo(), torch.device("cpu"), [])
        trainer.release()
        assert trainer.model.core.implementation == expected


def test_resume_is_exact(tiny, tmp_path: Path) -> None:
    """k steps, checkpoint, resume, k more == 2k steps uninterrupted, bit for bit (CPU)."""
    sched = {"schedule": "paper", "decay_steps": 5, "min_lr": 1e-3}
    straight = tiny(run_name="straight", steps=20)
    straight.optim.__dict__.update(sched)
    run(straight, "nth-farthest")
    first = tiny(run_name="split", steps=10)
    first.optim.__dict__.update(sched)
    run(first, "nth-farthest")
    second = tiny(run_name="split", steps=20, resume=tmp_path / "split")
    second.optim.__dict__.update(sched)
    result = run(second, "nth-farthest")
    assert result.summary["steps"] == 20
    a, b = weights(tmp_path / "straight"), weights(tmp_path / "split")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    sa = ckpt_io.load_train_state(ckpt_io.resolve_checkpoint(tmp_path / "straight"))
    sb = ckpt_io.load_train_state(ckpt_io.resolve_checkpoint(tmp_path / "split"))
    assert sa["scheduler"]["_last_lr"] == sb["scheduler"]["_last_lr"]
    steps = [r["step"] for r in read_metrics(tmp_path / "split" / "metrics.jsonl")]
    assert steps == sorted(steps) and len(steps) == len(set(steps))  # one continuous log


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["term", "hup"])
def test_a_stop_signal_leaves_a_loadable_checkpoint(tmp_path: Path, signum: int) -> None:
    """SIGTERM, and SIGHUP (a closed terminal, which killed the run without a checkpoint),
    finish the step, checkpoint and exit with 128 + the signal's number."""
    cmd = [
        sys.executable,
        "-m",
        "relmem",
        "train",
        "nth-farthest",
        "--device",
        "cpu",
        "--steps",
        "100000",
        "--batch-size",
        "16",
        "--checkpoint-every",
        "100000",
        "--log-every",
        "5",
        "--eval-every",
        "100000",
        "--task.test-size",
        "32",
        "--rmc.mem-slots",
        "2",
        "--rmc.num-heads",
        "2",
        "--rmc.head-size",
        "4",
        "--head.hidden-sizes",
        "16",
        "--no-tensorboard",
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "sig",
    ]
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    metrics = tmp_path / "sig" / "metrics.jsonl"
    deadline = time.monotonic() + 60
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        assert proc.poll() is None, proc.stdout.read().decode()
        assert time.monotonic() < deadline, "the run did not start logging"
        time.sleep(0.2)
    proc.send_signal(signum)
    output = proc.communicate(timeout=60)[0].decode()
    assert proc.returncode == 128 + signum, output
    assert signal.Signals(signum).name in output and "Ctrl-C" not in output
    config, _, _, model, ckpt = load_trained(tmp_path / "sig")
    step = ckpt_io.load_train_state(ckpt)["step"]
    assert 10 <= step < 100000
    summary = json.loads((tmp_path / "sig" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["steps"] == step


@pytest.mark.parametrize("damage", ["truncate_weights", "corrupt_state", "drop_meta"])
def test_damaged_checkpoint_is_reported_and_previous_usable(tiny, tmp_path: Path, damage: str):
    run(tiny(steps=20, checkpoint_every=10, keep_checkpoints=2), "nth-farthest")
    ckpts = ckpt_io.list_checkpoints(tmp_path / "run")
    assert [c.name for c in ckpts] == ["step-00000010", "step-00000020"]
    latest = ckpts[-1]
    if damage == "truncate_weights":
        path = latest / ckpt_io.MODEL_FILE
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        bad = ckpt_io.MODEL_FILE
    elif damage == "corrupt_state":
        path = latest / ckpt_io.STATE_FILE
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
        bad = ckpt_io.STATE_FILE
    else:
        (latest / ckpt_io.META_FILE).unlink()
        bad = ckpt_io.META_FILE
    resume = tiny(steps=30, resume=tmp_path / "run")
    with pytest.raises(ckpt_io.CheckpointError, match=bad) as info:
        run(resume, "nth-farthest")
    assert "step-00000010" in str(info.value)  # names the previous good checkpoint
    result = run(tiny(steps=30, resume=ckpts[0]), "nth-farthest")
    assert result.status == "completed" and result.summary["steps"] == 30


def test_checkpoint_files_are_safe_formats(tiny, tmp_path: Path) -> None:
    run(tiny(steps=10), "nth-farthest")
    ckpt = ckpt_io.resolve_checkpoint(tmp_path / "run")
    state = torch.load(ckpt / ckpt_io.STATE_FILE, weights_only=True)
    assert state["step"] == 10 and "optimizer" in state and "rng" in state
    assert not any(name.startswith(("module.", "_orig_mod.")) for name in weights(tmp_path / "run"))
    assert not [p for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name.startswith(".")]


class _NaNAfter(NthFarthest):
    """Nth Farthest whose loss turns NaN on the 8th call (step 8)."""

    calls = 0

    def measure(self, logits, batch):
        type(self).calls += 1
        measures = super().measure(logits, batch)
        if type(self).calls >= 8:
            total, count = measures["loss"]
            measures["loss"] = Measure(total * float("nan"), count)
        return measures


def test_nonfinite_loss_stops_and_keeps_last_good_checkpoint(tiny, tmp_path: Path, capsys):
    _NaNAfter.calls = 0
    config = tiny(steps=20, checkpoint_every=5, eval_every=100)
    with registered("nan-after-7", NthFarthestConfig, _NaNAfter):
        result = run(config, "nan-after-7")
    assert result.status == "diverged" and result.exit_code == EXIT_DIVERGED
    err = capsys.readouterr().err
    assert "nan" in err and "step 8" in err and "step-00000005" in err
    ckpt = ckpt_io.resolve_checkpoint(tmp_path / "run")
    assert ckpt.name == "step-00000005"
    assert all(torch.isfinite(t).all() for t in weights(tmp_path / "run").values())
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "diverged"


def test_new_run_refuses_to_overwrite(tiny) -> None:
    run(tiny(steps=5, checkpoint_every=5), "nth-farthest")
    with pytest.raises(FileExistsError, match="--resume"):
        run(tiny(steps=5), "nth-farthest")


def test_time_limit_evaluates_the_final_weights(tiny, monkeypatch) -> None:
    """A run stopped by its time limit reports the held-out figures of the weights it saved."""
    # The time limit is up from the 7th step on, between two evaluations (every 5 steps).
    monkeypatch.setattr(Progress, "session", lambda self: 1e9 if self.step >= 6 else 0.0)
    result = run(tiny(steps=50, eval_every=5, time_limit_min=1.0), "nth-farthest")
    assert result.status == "time_limit"
    assert result.summary["steps"] == result.summary["held_out_step"] == 7
    evals = [r for r in read_metrics(result.run_dir / "metrics.jsonl") if "eval/accuracy" in r]
    assert evals[-1]["step"] == 7
    assert result.summary["held_out_accuracy"] == evals[-1]["eval/accuracy"]


def test_cpu_threads_applies_and_is_recorded(tiny) -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        result = run(tiny(steps=2, cpu_threads=1), "nth-farthest")
        assert torch.get_num_threads() == 1
        assert (
            json.loads((result.run_dir / "run.json").read_text())["invocations"][-1]["num_threads"]
            == 1
        )
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="cpu_threads must be >= 1"):
        tiny(cpu_threads=0).__post_init__()


def test_config_round_trip_and_strictness(tiny) -> None:
    config = tiny()
    data = config_to_dict(config)
    cls = TrainConfig[NthFarthestConfig]
    assert config_from_dict(cls, json.loads(json.dumps(data))) == config
    with pytest.raises(ValueError, match="unknown keys.*'bogus'"):
        config_from_dict(cls, {**data, "bogus": 1})
    with pytest.raises(TypeError, match="config.steps"):
        config_from_dict(cls, {**data, "steps": "many"})


def test_paper_schedule() -> None:
    config = TrainConfig(task=NthFarthestConfig())
    config.optim.schedule = "paper"
    assert lr_multiplier(0, config) == 1.0
    assert lr_multiplier(10000, config) == pytest.approx(0.9)
    assert lr_multiplier(10**6, config) == pytest.approx(0.8)  # floor 8e-5 / 1e-4


def test_cosine_schedule_and_warmup() -> None:
    config = TrainConfig(task=NthFarthestConfig(), steps=1000)
    config.optim = OptimConfig(lr=1e-3, min_lr=1e-4, schedule="cosine")
    assert lr_multiplier(0, config) == 1.0
    assert lr_multiplier(500, config) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_multiplier(1000, config) == pytest.approx(0.1)
    assert lr_multiplier(5000, config) == pytest.approx(0.1)  # a resume with more steps holds
    config.optim.warmup_steps = 100
    assert lr_multiplier(0, config) == pytest.approx(0.01)
    assert lr_multiplier(49, config) == pytest.approx(
        0.5 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.049)))
    )
    config.optim.schedule = "constant"
    assert [lr_multiplier(s, config) for s in (0, 98, 99, 500)] == pytest.approx([0.01, 0.99, 1, 1])
    with pytest.raises(ValueError, match="warmup_steps"):
        OptimConfig(warmup_steps=-1)


def test_the_optimiser_steps_on_clipped_gradients(tiny) -> None:
    """The clip must come before the step (a mutation that stepped first passed every learning
    test: Adam barely reacts to a constant gradient scale)."""
    config = tiny(run_name="clip")
    config.optim = OptimConfig(lr=1e-3, grad_clip=1e-3)
    trainer = Trainer(config, "nth-farthest", DistInfo(), torch.device("cpu"), [])
    trainer.release()
    seen = []
    real_step = trainer.optimizer.step

    def step(*args, **kwargs):
        grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
        seen.append(float(torch.nn.utils.get_total_norm(grads)))
        return real_step(*args, **kwargs)

    trainer.optimizer.step = step
    batch = trainer.sample(1, config.batch_size)
    logits, _ = trainer.model(batch.inputs)
    norm = trainer.apply_gradients(trainer.task.loss(logits, batch))
    assert float(norm) > 1e-2 and seen == [pytest.approx(1e-3, rel=1e-4)]


def test_a_log_line_covers_the_steps_since_the_previous_one(tiny) -> None:
    """The training window restarts at each closed log line (a mutation that never reset it
    was caught only by a learning threshold narrowly missed)."""
    config = tiny(run_name="window")
    trainer = Trainer(config, "nth-farthest", DistInfo(), torch.device("cpu"), [])
    trainer.release()
    losses = []
    real_add = trainer.window.add

    def add(measures, groups):
        total, count = measures["loss"]
        losses.append(float(total.sum() / count.sum()))
        real_add(measures, groups)

    trainer.window.add = add
    for _ in range(2):
        trainer.step(0, False)
    trainer.train_metrics()
    for _ in range(3):
        trainer.step(0, False)
    second = trainer.train_metrics()["train/loss"]
    assert second == pytest.approx(sum(losses[2:]) / 3, rel=1e-5)
