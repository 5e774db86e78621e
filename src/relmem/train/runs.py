"""Reading run directories back: the resolved config and the trained model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from relmem.tasks.base import Task, get_task
from relmem.train import checkpoint as ckpt_io
from relmem.train.config import TrainConfig, config_from_dict


def load_run_config(run_dir: Path) -> tuple[str, TrainConfig]:
    """``(task_name, config)`` from ``RUN_DIR/config.json`` (strictly validated).

    Raises:
        FileNotFoundError: no ``config.json`` in ``run_dir``.
        ValueError / TypeError: the file does not describe a valid config.
    """
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: is {run_dir} a relmem run directory?")
    data: dict[str, Any] = json.loads(path.read_text())
    task_name = data.pop("task_name", None)
    if not isinstance(task_name, str):
        raise ValueError(f"{path}: no task_name")
    entry = get_task(task_name)
    return task_name, config_from_dict(TrainConfig[entry.config_cls], data, where=str(path))


def load_trained(
    run_dir: Path, checkpoint: Path | None = None, device: torch.device | str = "cpu"
) -> tuple[TrainConfig, str, Task, nn.Module, Path]:
    """Rebuild a run's task and model and load a checkpoint's weights.

    Args:
        run_dir: the run directory.
        checkpoint: a checkpoint directory; None means the run's latest.
        device: where to put the model.

    Returns:
        ``(config, task_name, task, model in eval mode, checkpoint directory)``.
    """
    from relmem.train.loop import build_model

    task_name, config = load_run_config(run_dir)
    task = get_task(task_name).build(config.task)
    ckpt = ckpt_io.resolve_checkpoint(checkpoint if checkpoint is not None else run_dir)
    model = build_model(config, task).to(device)
    ckpt_io.load_weights(ckpt, model, device)
    return config, task_name, task, model.eval(), ckpt
