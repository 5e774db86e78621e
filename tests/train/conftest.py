"""Tiny Nth Farthest and repeat-copy configurations that train in seconds on a CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from relmem.models import DNCModelConfig, HeadConfig, LSTMModelConfig, RMCModelConfig
from relmem.tasks import NthFarthestConfig, RepeatCopyConfig
from relmem.train.config import OptimConfig, TrainConfig


def tiny_dnc() -> DNCModelConfig:
    """Controller 16, N=8, W=8, R=2, Wh=1."""
    return DNCModelConfig(hidden_size=16, memory_size=8, word_size=8, num_read_heads=2)


def tiny_config(out_dir: Path, **overrides: Any) -> TrainConfig:
    """K=4, F=4, a 2-slot RMC / 16-unit LSTM / small DNC, batch 32, no TensorBoard."""
    config = TrainConfig(
        task=NthFarthestConfig(num_objects=4, num_features=4, test_size=64),
        model="rmc",
        rmc=RMCModelConfig(mem_slots=2, head_size=8, num_heads=2),
        lstm=LSTMModelConfig(hidden_size=16),
        dnc=tiny_dnc(),
        head=HeadConfig((32,)),
        optim=OptimConfig(lr=3e-3, grad_clip=1.0),
        steps=20,
        batch_size=32,
        eval_every=10,
        eval_batch=64,
        log_every=5,
        checkpoint_every=10,
        device="cpu",
        out_dir=out_dir,
        run_name="run",
        tensorboard=False,
    )
    for name, value in overrides.items():
        setattr(config, name, value)
    return config


@pytest.fixture
def tiny(tmp_path: Path):
    """A factory: ``tiny(**overrides) -> TrainConfig`` writing under ``tmp_path``."""
    return lambda **overrides: tiny_config(tmp_path, **overrides)


def tiny_copy_config(out_dir: Path, **overrides: Any) -> TrainConfig:
    """deepmind's repeat copy (4 bits, length 1-2, repeats 1-2), a small DNC, batch 16.

    :func:`tiny_config`'s budget and models, but the default head (a per-step task has no MLP
    head, and a new run refuses the option then).
    """
    copy_settings = {
        "task": RepeatCopyConfig(test_size=64),
        "model": "dnc",
        "head": HeadConfig(),
        "lstm": LSTMModelConfig(hidden_size=32),
        "optim": OptimConfig(lr=1e-2, grad_clip=50.0),
        "batch_size": 16,
        "eval_batch": 32,
    }
    return tiny_config(out_dir, **(copy_settings | overrides))


@pytest.fixture
def tiny_copy(tmp_path: Path):
    """A factory: ``tiny_copy(**overrides) -> TrainConfig`` (repeat copy) under ``tmp_path``."""
    return lambda **overrides: tiny_copy_config(tmp_path, **overrides)
