"""Metric logging: a three-method logger protocol, JSONL and TensorBoard back-ends.

``metrics.jsonl`` is the source of truth for plots (``relmem plot`` reads only it); each line is
``{"step": ..., "time_s": ..., <metric>: ...}``. TensorBoard is an optional mirror.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Protocol


class MetricLogger(Protocol):
    """What the trainer calls; see torchtune's ``metric_logging``."""

    def log_dict(self, metrics: dict[str, float], step: int) -> None:
        """Record ``metrics`` at ``step``."""
        ...

    def log_config(self, config: dict[str, Any]) -> None:
        """Record the resolved config once per run."""
        ...

    def close(self) -> None:
        """Flush and release files."""
        ...


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


class JsonlLogger:
    """Append one JSON object per :meth:`log_dict` call to ``path`` (non-finite → null).

    A new run (``resume_step`` None) starts the file afresh. When resuming at ``resume_step``,
    lines of steps after it (logged by the interrupted run after its last checkpoint) are
    dropped so the file reads as one continuous run.
    """

    def __init__(self, path: Path, resume_step: int | None = None) -> None:
        self.path = Path(path)
        if resume_step is None:
            self.path.write_text("")
        elif self.path.exists():
            kept = [
                line
                for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= resume_step
            ]
            self.path.write_text("".join(line + "\n" for line in kept))
        self._file = open(self.path, "a", buffering=1)  # noqa: SIM115 - closed in close()

    def log_dict(self, metrics: dict[str, float], step: int) -> None:
        record = {"step": step, **{k: _finite_or_none(float(v)) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")

    def log_config(self, config: dict[str, Any]) -> None:
        """The config lives in ``config.json``; nothing to add to the metric stream."""

    def close(self) -> None:
        self._file.close()


class TensorBoardLogger:
    """Scalars under ``log_dir`` via ``torch.utils.tensorboard``; ``purge_step`` on resume."""

    def __init__(self, log_dir: Path, purge_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(str(log_dir), purge_step=purge_step)

    def log_dict(self, metrics: dict[str, float], step: int) -> None:
        for name, value in metrics.items():
            self._writer.add_scalar(name, value, step)

    def log_config(self, config: dict[str, Any]) -> None:
        self._writer.add_text("config", "```\n" + json.dumps(config, indent=2) + "\n```")

    def close(self) -> None:
        self._writer.close()


class MultiLogger:
    """Fan every call out to several loggers."""

    def __init__(self, loggers: list[MetricLogger]) -> None:
        self.loggers = loggers

    def log_dict(self, metrics: dict[str, float], step: int) -> None:
        for logger in self.loggers:
            logger.log_dict(metrics, step)

    def log_config(self, config: dict[str, Any]) -> None:
        for logger in self.loggers:
            logger.log_config(config)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a ``metrics.jsonl`` file, in order."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
