"""A tiny reader's training options for the reading tests (imported by name, as
``tests/tasks/lm_sample.py``: a ``conftest`` module name is shared by every test folder)."""

from __future__ import annotations

from pathlib import Path

# a reader small enough to train in seconds on the sample
TINY = [
    "--task.word-size", "16", "--task.char-embedding", "4", "--task.char-channels", "8",
    "--task.hidden-size", "8", "--task.attention-window", "16", "--task.min-char-count", "1",
    "--dnc.memory-size", "4", "--dnc.word-size", "4", "--dnc.num-read-heads", "1",
    "--rmc.mem-slots", "2", "--rmc.head-size", "4", "--rmc.num-heads", "2",
    "--lstm.hidden-size", "8",
]  # fmt: skip


def train_args(squad_dir: Path, out: Path, name: str, *extra: str) -> list[str]:
    """``relmem train squad`` on the sample with the tiny reader (the CPU preset otherwise)."""
    return [
        "train", "squad", "--data-dir", str(squad_dir), "--device", "cpu", "--cpu-threads", "1",
        "--steps", "4", "--batch-size", "8", "--eval-every", "2", "--log-every", "2",
        "--checkpoint-every", "2", "--out-dir", str(out), "--run-name", name, "--no-tensorboard",
        *TINY, *extra,
    ]  # fmt: skip
