"""Tiny Nth Farthest configurations that train in seconds on a CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from relmem.models.classifier import HeadConfig, LSTMModelConfig, RMCModelConfig
from relmem.tasks.nth_farthest import NthFarthestConfig
from relmem.train.config import OptimConfig, TrainConfig


def tiny_config(out_dir: Path, **overrides: Any) -> TrainConfig:
    """K=4, F=4, a 2-slot RMC / 16-unit LSTM, batch 32, no TensorBoard."""
    config = TrainConfig(
        task=NthFarthestConfig(num_objects=4, num_features=4, test_size=64),
        model="rmc",
        rmc=RMCModelConfig(mem_slots=2, head_size=8, num_heads=2),
        lstm=LSTMModelConfig(hidden_size=16),
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
