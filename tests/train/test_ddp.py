"""``torchrun`` with 2 gloo processes matches one process with the same global batch, for a
last-step task (Nth Farthest, RMC) and a padded per-step task (repeat copy, DNC)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from processes import run_python
from safetensors.torch import load_file

from relmem.train import checkpoint as ckpt_io

ARGS = [
    "train",
    "nth-farthest",
    "--device",
    "cpu",
    "--steps",
    "8",
    "--batch-size",
    "32",
    "--eval-batch",
    "64",
    "--task.test-size",
    "64",
    "--log-every",
    "4",
    "--eval-every",
    "8",
    "--checkpoint-every",
    "8",
    "--rmc.mem-slots",
    "2",
    "--rmc.num-heads",
    "2",
    "--rmc.head-size",
    "4",
    "--head.hidden-sizes",
    "16",
    "--optim.lr",
    "3e-3",
    "--no-tensorboard",
    "--cpu-threads",
    "1",
]
# Each rank's slice of a repeat-copy batch is trimmed to its own longest sequence.
COPY_ARGS = [
    "train", "repeat-copy", "--device", "cpu", "--steps", "8", "--batch-size", "16",
    "--eval-batch", "32", "--task.test-size", "64", "--log-every", "4", "--eval-every", "8",
    "--checkpoint-every", "8", "--dnc.hidden-size", "16", "--dnc.memory-size", "8",
    "--dnc.word-size", "8", "--no-tensorboard", "--cpu-threads", "1",
]  # fmt: skip
# gloo's teardown sometimes aborts a rank after the run has completed and every rank has passed
# the final barrier (std::terminate in a destructor: "terminate called without an active
# exception"); the run's results are all written by then. Seen about once in a few CI runs on
# the 2-core VM. Such a launch is run once more; any other failure fails the test.
TEARDOWN_ABORT = "terminate called without an active exception"


def run_ddp(command: list[str], run_name: str):
    ddp = run_python([*command, run_name], processes=2, timeout=180)
    output = ddp.stdout + ddp.stderr
    if ddp.returncode != 0 and TEARDOWN_ABORT in output and "relmem: completed" in output:
        ddp = run_python([*command, f"{run_name}-again"], processes=2, timeout=180)
    return ddp


@pytest.mark.parametrize("args", [ARGS, COPY_ARGS], ids=["nth-farthest-rmc", "repeat-copy-dnc"])
def test_two_process_gloo_matches_single_process(tmp_path: Path, args: list[str]) -> None:
    command = ["-m", "relmem", *args, "--out-dir", str(tmp_path), "--run-name"]
    single = run_python([*command, "single"], timeout=120)
    assert single.returncode == 0, single.stderr
    ddp = run_ddp(command, "ddp")
    assert ddp.returncode == 0, ddp.stdout + ddp.stderr
    assert "x2 processes" in ddp.stdout
    ddp_dir = tmp_path / ("ddp-again" if (tmp_path / "ddp-again").exists() else "ddp")
    a = load_file(ckpt_io.resolve_checkpoint(tmp_path / "single") / ckpt_io.MODEL_FILE)
    b = load_file(ckpt_io.resolve_checkpoint(ddp_dir) / ckpt_io.MODEL_FILE)
    assert a.keys() == b.keys()
    for name in a:
        # The key half of the q/k/v LayerNorm bias has a gradient that is zero in exact
        # arithmetic (softmax ignores a per-query constant); Adam normalises its rounding noise
        # to steps of about lr, so there only the bound steps * lr = 8 * 3e-3 holds.
        atol = 2.4e-2 if name.endswith("qkv_norm.bias") else 1e-5
        torch.testing.assert_close(b[name], a[name], rtol=1e-4, atol=atol, msg=name)
    assert not any(name.startswith("module.") for name in b)
    # Each rank draws from its own global generator (dropout): every rank once drew rank 0's
    # masks. The checkpoint keeps every rank's state, so that a resume is exact per rank.
    rng = ckpt_io.load_train_state(ckpt_io.resolve_checkpoint(ddp_dir))["rng"]["ranks"]["cpu"]
    assert rng.shape[0] == 2 and not torch.equal(rng[0], rng[1])


@pytest.mark.slow
def test_a_two_process_resume_restores_every_rank_s_generator(tmp_path: Path) -> None:
    """8 steps straight, or 4 and a resume to 8, under torchrun: the same weights and the same
    per-rank generator states (a resume once gave every rank rank 0's)."""
    base = ["-m", "relmem", *ARGS, "--out-dir", str(tmp_path), "--checkpoint-every", "4"]
    straight = run_python([*base, "--run-name", "straight"], processes=2, timeout=180)
    assert straight.returncode == 0, straight.stdout + straight.stderr
    half = [*base, "--run-name", "split", "--steps", "4"]
    assert run_python(half, processes=2, timeout=180).returncode == 0
    rest = ["-m", "relmem", *ARGS, "--resume", str(tmp_path / "split")]
    resumed = run_python(rest, processes=2, timeout=180)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    states = [
        ckpt_io.load_train_state(ckpt_io.resolve_checkpoint(tmp_path / name))["rng"]["ranks"]
        for name in ("straight", "split")
    ]
    assert torch.equal(states[0]["cpu"], states[1]["cpu"])
    a, b = (
        load_file(ckpt_io.resolve_checkpoint(tmp_path / name) / ckpt_io.MODEL_FILE)
        for name in ("straight", "split")
    )
    assert all(torch.equal(a[k], b[k]) for k in a)
