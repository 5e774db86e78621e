"""Fault injection: a run killed again and again ends where an uninterrupted run ends.

One tiny run is driven through every way a training process stops early, each time resumed
from what it left: SIGKILL inside a checkpoint write, inside a log write, between a checkpoint's
rename and ``latest`` (the ``RELMEM_TEST_KILL_AT`` hook of :mod:`relmem.train.faults` makes
those windows reachable), SIGKILL at random moments, SIGTERM, and a time limit, the last two off
the log, evaluation and checkpoint grids. Its weights, Adam state and every metric record (wall
time aside) must equal those of an uninterrupted run of the same seed.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from processes import SRC
from safetensors.torch import load_file

from relmem import cli
from relmem.train import checkpoint as ckpt_io
from relmem.train.faults import KILL_AT_ENV
from relmem.train.loop import EXIT_SIGTERM
from relmem.train.metrics import STOP_KEY, read_metrics
from relmem.train.trainer import Progress, Trainer

STEPS = 60
ARGS = [
    "train", "nth-farthest", "--device", "cpu", "--cpu-threads", "1", "--seed", "3",
    "--steps", str(STEPS), "--batch-size", "8", "--log-every", "4", "--eval-every", "6",
    "--checkpoint-every", "5", "--eval-batch", "16", "--task.test-size", "16",
    "--task.num-objects", "4", "--task.num-features", "4", "--rmc.mem-slots", "2",
    "--rmc.num-heads", "1", "--rmc.head-size", "4", "--head.hidden-sizes", "8",
    "--optim.lr", "3e-3", "--no-tensorboard",
]  # fmt: skip
WALL_CLOCK = {"time_s", "perf/sequences_per_s", "perf/tokens_per_s"}


def command(out_dir: Path, *extra: str) -> list[str]:
    return [*ARGS, "--out-dir", str(out_dir), "--run-name", "run", *extra]


def start(args: list[str], kill_at: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    env.pop(KILL_AT_ENV, None)
    if kill_at is not None:
        env[KILL_AT_ENV] = kill_at
    return subprocess.Popen(
        [sys.executable, "-m", "relmem", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop_at_random(proc: subprocess.Popen, sig: int, rng: random.Random) -> tuple[str, str]:
    """Wait for the run to start training, then send ``sig`` after a random delay."""
    assert proc.stdout is not None
    line = proc.stdout.readline()  # 'relmem: resuming ...', printed once the run is set up
    assert "resuming" in line, line + proc.communicate()[1]
    time.sleep(rng.uniform(0.0, 1.0))
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    return line + out, err


def records(run_dir: Path) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in r.items() if k not in WALL_CLOCK}
        for r in read_metrics(run_dir / "metrics.jsonl")
    ]


def final_state(run_dir: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    ckpt = ckpt_io.resolve_checkpoint(run_dir)
    return load_file(ckpt / ckpt_io.MODEL_FILE), ckpt_io.load_train_state(ckpt)


def sigterm_at(step: int):
    """A replacement of ``Trainer.step`` that sends this process SIGTERM during ``step`` (the
    loop reads the flag before each step, so the run stops after ``step + 1``)."""
    original = Trainer.step

    def step_and_signal(self: Trainer, signum: int, time_up: bool) -> Any:
        if self.progress.step + 1 == step:
            os.kill(os.getpid(), signal.SIGTERM)  # handled as a user's would be: flag, step, save
        return original(self, signum, time_up)

    return step_and_signal


def kill_resume_compare(tmp_path: Path, monkeypatch, random_kills: int) -> None:
    """The uninterrupted run, then the faulty one (see the module docstring), then compare."""
    threads = torch.get_num_threads()
    try:
        assert cli.main(command(tmp_path / "straight")) == 0
        faulty = tmp_path / "faulty"
        run_dir = faulty / "run"
        resume = command(faulty, "--resume", str(run_dir))

        # SIGKILL inside the writes, at fixed steps (none on the log grid of 4).
        for args, kill_at in [
            (command(faulty), "checkpoint@10"),  # weights staged, state not yet written
            (resume, "log@18"),  # half of step 18's metric line on disk (eval grid of 6)
            (resume, "checkpoint-rename@25"),  # step 25 in place, latest still names 20
        ]:
            proc = start(args, kill_at)
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == -signal.SIGKILL, err
            if kill_at.startswith("checkpoint-rename"):  # the resume after the torn log line
                torn = [line for line in err.splitlines() if "torn line" in line]
                assert torn and "metrics.jsonl" in torn[0] and "step 15" in torn[0], err
        assert ckpt_io.resolve_checkpoint(run_dir).name == "step-00000020"

        # SIGTERM arriving in step 33 (seen at the next step's check: the run stops after 34),
        # in process; then a time limit, up before step 43.
        monkeypatch.setattr(Trainer, "step", sigterm_at(33))
        assert cli.main(resume) == EXIT_SIGTERM
        monkeypatch.undo()
        assert ckpt_io.resolve_checkpoint(run_dir).name == "step-00000034"
        monkeypatch.setattr(Progress, "session", lambda self: 1e9 if self.step >= 42 else 0)
        assert cli.main([*resume, "--time-limit-min", "1"]) == 0
        monkeypatch.undo()
        stopped = json.loads((run_dir / "summary.json").read_text())
        assert stopped["status"] == "time_limit" and stopped["steps"] == 43
        assert read_metrics(run_dir / "metrics.jsonl")[-1][STOP_KEY] == 1.0

        # SIGKILL at random moments (seeded: a failure repeats).
        rng = random.Random(16)
        for _ in range(random_kills):
            stop_at_random(start(resume), signal.SIGKILL, rng)
        assert cli.main(resume) == 0
    finally:
        torch.set_num_threads(threads)

    want, got = records(tmp_path / "straight" / "run"), records(run_dir)
    assert [r["step"] for r in got] == [r["step"] for r in want]
    assert got == want
    weights_a, state_a = final_state(tmp_path / "straight" / "run")
    weights_b, state_b = final_state(run_dir)
    assert weights_a.keys() == weights_b.keys()
    for name in weights_a:
        assert torch.equal(weights_a[name], weights_b[name]), name
    adam_a, adam_b = state_a["optimizer"]["state"], state_b["optimizer"]["state"]
    assert adam_a.keys() == adam_b.keys()
    for index in adam_a:
        for key in adam_a[index]:
            assert torch.equal(adam_a[index][key], adam_b[index][key]), (index, key)


def test_killed_and_resumed_run_equals_an_uninterrupted_one(tmp_path: Path, monkeypatch) -> None:
    kill_resume_compare(tmp_path, monkeypatch, random_kills=1)


@pytest.mark.slow
def test_many_random_kills(tmp_path: Path, monkeypatch) -> None:
    kill_resume_compare(tmp_path, monkeypatch, random_kills=8)


def test_a_second_process_is_refused_while_one_trains(tmp_path: Path) -> None:
    first = start(command(tmp_path, "--steps", "100000"))
    latest = tmp_path / "run" / "checkpoints" / "latest"
    deadline = time.monotonic() + 60
    while not latest.exists():
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.1)
    try:
        second = start(command(tmp_path, "--resume", str(tmp_path / "run")))
        _, err = second.communicate(timeout=120)
    finally:
        first.kill()
        first.communicate()
    assert second.returncode == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "in use by another training process" in lines[0], err
    assert f"pid {first.pid}" in lines[0]
