"""Test-only tasks: a stream that needs state carried across batches, a token-weighted copy
task and a task that records the steps it is sampled at. Run as a script under ``torchrun``,
it trains the token-weighted task (see ``test_stateful.py``)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from relmem.models import LSTMModelConfig
from relmem.tasks import NthFarthest, RepeatCopyConfig, RepeatCopyTask
from relmem.tasks.base import ACCURACY, Batch, Measure, Task, TaskSpec, step_generator
from relmem.tasks.registry import registered
from relmem.train.config import OptimConfig, TrainConfig
from relmem.train.loop import run


@dataclass
class EpisodeBitsConfig:
    """A bit stream cut into windows of ``window`` steps; every ``episodes`` windows make an
    episode. Its first step carries a marker and a key bit; every step of the episode asks for
    the key. ``carry``: the task is stateful; without it each window is a sequence of its own.
    """

    window: int = 4
    episodes: int = 3
    carry: bool = True
    key_seed: int = 11
    test_rows: int = 128
    test_episodes: int = 2
    test_seed: int = 5


class EpisodeBits(Task):
    """The first bit of the episode, asked at every step; windows after the first of an
    episode can only be answered with the state carried from the earlier ones."""

    metric = ACCURACY

    def __init__(self, config: EpisodeBitsConfig) -> None:
        self.config = config
        self.stateful = config.carry
        self.spec = TaskSpec(input_size=2, seq_len=config.window, output_size=1, output="per_step")

    def _window(self, rows: int, noise: torch.Generator, step: int, key_seed: int) -> Batch:
        c = self.config
        device = noise.device
        episode, position = divmod(step, c.episodes)
        keys = torch.randint(
            0, 2, (rows,), generator=step_generator(device, key_seed, episode), device=device
        )
        bits = torch.randint(0, 2, (rows, c.window), generator=noise, device=device).float()
        marker = torch.zeros(rows, c.window, device=device)
        if position == 0:
            marker[:, 0] = 1.0
            bits[:, 0] = keys.float()
        inputs = torch.stack([marker, bits], dim=-1)  # [B, T, 2]
        targets = keys.float().view(rows, 1, 1).expand(rows, c.window, 1)
        return Batch(inputs, targets.contiguous(), mask=torch.ones(rows, c.window, device=device))

    def sample(self, batch_size: int, generator: torch.Generator, step: int = 0) -> Batch:
        return self._window(batch_size, generator, step, self.config.key_seed)

    def held_out(self, device: torch.device) -> Batch:
        c = self.config
        cpu = torch.device("cpu")
        steps = range(c.test_episodes * c.episodes)
        windows = [
            self._window(c.test_rows, step_generator(cpu, c.test_seed, s), s, c.test_seed + 1)
            for s in steps
        ]
        if c.carry:  # one long row per stream
            rows = Batch(
                *(
                    torch.cat(parts, dim=1) if parts[0] is not None else None
                    for parts in zip(*windows, strict=True)
                )
            )
        else:  # every window a sequence of its own
            rows = Batch(
                *(
                    torch.cat(parts) if parts[0] is not None else None
                    for parts in zip(*windows, strict=True)
                )
            )
        return rows.to(device)

    def measure(self, logits: Tensor, batch: Batch) -> dict[str, Measure]:
        xent = F.binary_cross_entropy_with_logits(logits, batch.targets, reduction="none")
        correct = ((logits > 0).float() == batch.targets).float()
        steps = batch.mask.sum(1)
        return {
            "loss": Measure(xent.sum((1, 2)), steps),
            "accuracy": Measure(correct.sum((1, 2)), steps),
        }


class TokenCopy(RepeatCopyTask):
    """Repeat copy whose loss and bit errors are token-weighted: per example, sums over its
    scored steps and the number of those steps (which differs from row to row)."""

    def measure(self, logits: Tensor, batch: Batch) -> dict[str, Measure]:
        measures = super().measure(logits, batch)
        steps = batch.mask.sum(1)
        return {name: Measure(m.total, steps) for name, m in measures.items()}


class StepProbe(NthFarthest):
    """Nth Farthest that records ``(batch_size, step)`` of every draw."""

    calls: list[tuple[int, int]] = []

    def sample(self, batch_size: int, generator: torch.Generator, step: int = 0) -> Batch:
        type(self).calls.append((batch_size, step))
        return super().sample(batch_size, generator, step)


def token_copy_config(out_dir: Path, run_name: str) -> TrainConfig:
    """Repeat copy with uneven scored steps (lengths 1-3, repeats 1-3), a small LSTM."""
    return TrainConfig(
        task=RepeatCopyConfig(max_length=3, max_repeats=3, test_size=37),
        model="lstm",
        lstm=LSTMModelConfig(hidden_size=16),
        optim=OptimConfig(lr=1e-2, grad_clip=50.0),
        steps=4,
        batch_size=16,
        eval_every=4,
        eval_batch=16,
        log_every=1,
        checkpoint_every=4,
        device="cpu",
        out_dir=out_dir,
        run_name=run_name,
        tensorboard=False,
    )


if __name__ == "__main__":
    with registered("token-copy", RepeatCopyConfig, TokenCopy):
        run(token_copy_config(Path(sys.argv[1]), sys.argv[2]), "token-copy")
