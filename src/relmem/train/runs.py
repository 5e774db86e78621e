"""Run directories: creating and recording them, reading their config and model back.

A run directory holds ``config.json`` (the resolved :class:`TrainConfig` and the task's name),
``run.json`` (one record per invocation: command line, versions, git SHA, device),
``metrics.jsonl``, ``tb/``, ``checkpoints/`` and ``summary.json``.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import relmem
import relmem.models as models
from relmem.env_info import device_name, git_sha
from relmem.tasks.base import Task
from relmem.tasks.registry import get_task
from relmem.train import checkpoint as ckpt_io
from relmem.train.config import TrainConfig, config_from_dict
from relmem.train.distributed import DistInfo


def build_model(config: TrainConfig, task: Task) -> nn.Module:
    """The registered model ``config.model`` for ``task``, on the CPU, seeded by ``seed``."""
    torch.manual_seed(config.seed)
    return models.build_model(config.model, config.model_config(), config.head, task.spec)


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON, atomically (a temporary file, then ``os.replace``)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def new_run_dir(config: TrainConfig, task_name: str, info: DistInfo) -> Path:
    """``out_dir / run_name`` (default ``{task}-{model}-{UTC time}``), the same on every rank.

    Raises:
        FileExistsError: the directory already holds checkpoints (resume it instead).
    """
    name = config.run_name
    if name is None:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
        name = f"{task_name}-{config.model}-{stamp}"
    if info.enabled:  # every rank must agree on the (time-stamped) name
        holder = [name]
        dist.broadcast_object_list(holder, src=0)
        name = holder[0]
    run_dir = config.out_dir / name
    if ckpt_io.list_checkpoints(run_dir):
        raise FileExistsError(
            f"run directory {run_dir} already holds checkpoints; pass --resume {run_dir} to "
            "continue it, or choose another --run-name"
        )
    return run_dir


def read_invocations(run_dir: Path) -> dict[str, Any] | None:
    """``run.json``'s record (``{"invocations": [...]}``), a new one when there is none, or
    None when the file is damaged (:func:`record_invocation` then keeps it aside and warns)."""
    path = run_dir / "run.json"
    if not path.exists():
        return {"invocations": []}
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(record, dict) and isinstance(record.get("invocations"), list)
    return record if ok else None


def record_invocation(
    run_dir: Path,
    config: TrainConfig,
    device: torch.device,
    info: DistInfo,
    argv: list[str] | None,
    record: dict[str, Any] | None,
) -> None:
    """Append this invocation (command line, versions, git SHA, device) to ``run.json``.

    ``record`` is :func:`read_invocations`' result, read before anything in the run changed;
    None (a damaged file) moves the file to ``run.json.damaged`` and starts a new history.
    """
    path = run_dir / "run.json"
    if record is None:
        kept = path.with_name("run.json.damaged")
        os.replace(path, kept)
        print(f"relmem: warning: {path} was damaged; kept it as {kept}", file=sys.stderr)
        record = {"invocations": []}
    record["invocations"].append(
        {
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "argv": list(sys.argv if argv is None else argv),
            "resume": None if config.resume is None else str(config.resume),
            "relmem": relmem.__version__,
            "git_sha": git_sha(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "host": platform.node(),
            "device": str(device),
            "device_name": device_name(device),
            "world_size": info.world_size,
            "num_threads": torch.get_num_threads(),
        }
    )
    write_json(path, record)


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
        checkpoint: a checkpoint directory; None means the run's latest, or when ``latest`` is
            missing or bad or its weights damaged, the newest intact one (named on stderr).
        device: where to put the model.

    Returns:
        ``(config, task_name, task, model in eval mode, checkpoint directory)``.
    """
    task_name, config = load_run_config(run_dir)
    task = get_task(task_name).build(config.task)
    if checkpoint is None:
        ckpt, note = ckpt_io.newest_intact(run_dir)
        if note:
            print(f"relmem: warning: {note}", file=sys.stderr)
    else:
        ckpt = ckpt_io.resolve_checkpoint(checkpoint)
    model = build_model(config, task).to(device)
    ckpt_io.load_weights(ckpt, model, device)
    return config, task_name, task, model.eval(), ckpt
