"""The reading tests' sample: SQuAD-layout files written for them (tests/data/squad), copied
into each test's folder so caches land there, and a tiny reader's training options."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "squad"

# a reader small enough to train in seconds on the sample
TINY = [
    "--task.word-size", "16", "--task.char-embedding", "4", "--task.char-channels", "8",
    "--task.hidden-size", "8", "--task.attention-window", "16", "--task.min-char-count", "1",
    "--dnc.memory-size", "4", "--dnc.word-size", "4", "--dnc.num-read-heads", "1",
    "--rmc.mem-slots", "2", "--rmc.head-size", "4", "--rmc.num-heads", "2",
    "--lstm.hidden-size", "8",
]  # fmt: skip


@pytest.fixture
def squad_dir(tmp_path: Path) -> Path:
    """A folder holding the v1.1 sample as train and dev file, and the v2.0 sample."""
    folder = tmp_path / "squad"
    folder.mkdir()
    shutil.copy(SAMPLE / "sample-v1.1.json", folder / "train-v1.1.json")
    shutil.copy(SAMPLE / "sample-v1.1.json", folder / "dev-v1.1.json")
    shutil.copy(SAMPLE / "sample-v2.0.json", folder / "sample-v2.0.json")
    return folder


def train_args(squad_dir: Path, out: Path, name: str, *extra: str) -> list[str]:
    """``relmem train squad`` on the sample with the tiny reader (the CPU preset otherwise)."""
    return [
        "train", "squad", "--data-dir", str(squad_dir), "--device", "cpu", "--cpu-threads", "1",
        "--steps", "4", "--batch-size", "8", "--eval-every", "2", "--log-every", "2",
        "--checkpoint-every", "2", "--out-dir", str(out), "--run-name", name, "--no-tensorboard",
        *TINY, *extra,
    ]  # fmt: skip
