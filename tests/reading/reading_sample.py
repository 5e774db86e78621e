"""A tiny reader's training options for the reading tests (imported by name, as
``tests/tasks/lm_sample.py``: a ``conftest`` module name is shared by every test folder)."""

from __future__ import annotations

from pathlib import Path

import torch

from relmem.tasks.reading.task import ReadingConfig

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


class Spotter(torch.nn.Module):
    """A stand-in reader: each word id of ``words`` scores its value as start and end, every
    other context token ``other`` and "no answer" ``null`` (``-inf``: never); padding
    ``-inf``. ``forward`` is the reader's: ``(inputs, state, lengths) -> (logits [B, 1 + T,
    2], None)``."""

    def __init__(self, words: dict[int, float], other: float, null: float) -> None:
        super().__init__()
        self.words, self.other, self.null = words, other, null
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def forward(self, inputs, state, lengths):
        block = ReadingConfig().question_tokens
        words = inputs[:, block:, 0]  # [B, T]
        scores = torch.full(words.shape, self.other)
        for word, score in self.words.items():
            scores = scores.masked_fill(words == word, score)
        steps = torch.arange(words.shape[1])
        scores = scores.masked_fill(steps >= (lengths - block).unsqueeze(1), float("-inf"))
        null = torch.full((words.shape[0], 1), self.null)
        logits = torch.cat([null, scores], dim=1)  # [B, 1 + T]
        return torch.stack([logits, logits], dim=-1), None  # [B, 1 + T, 2]
