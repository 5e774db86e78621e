"""Metric logging: a three-method logger protocol, JSONL and TensorBoard back-ends.

``metrics.jsonl`` is the source of truth for plots (``relmem plot`` reads only it); each line is
``{"step": ..., "time_s": ..., <metric>: ...}``. It is append-only: a resume cuts it back at a
record boundary (:class:`JsonlLogger`), so a kill never loses a record the last checkpoint
covers. TensorBoard is an optional mirror.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Protocol

from relmem.train import faults

# Set (to 1) on the evaluation logged when a run stops off the evaluation grid (a time limit, or
# its last step between evaluations): a run resumed past that step has no such record, so a
# resume cuts it (``JsonlLogger``).
STOP_KEY = "stop"


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


class MetricsFileError(ValueError):
    """A ``metrics.jsonl`` that cannot be used: a line other than the last is not a JSON object
    (not a torn write), or the file is a symbolic link."""


def _parse_line(line: bytes) -> dict[str, Any] | None:
    """The record of one line, or None when it is not a JSON object."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _scan(path: Path) -> tuple[list[tuple[int, dict[str, Any]]], int, bool]:
    """``([(start offset, record)], end of the last complete record, torn)`` of ``path``.

    The last line is torn when it lacks its newline or does not parse: a kill cut its write.

    Raises:
        MetricsFileError: an earlier line does not parse, or a complete record has no integer
            ``step`` (the file is damaged otherwise; a resume would cut it there).
    """
    data = path.read_bytes()
    lines = data.split(b"\n")  # the last item follows the last newline (b"" when complete)
    records, offset, torn = [], 0, False
    for number, line in enumerate(lines, start=1):
        last = number == len(lines) or (number == len(lines) - 1 and not lines[-1].strip())
        if line.strip():
            record = _parse_line(line)
            if record is None or number == len(lines):  # unparsable, or no newline after it
                if not last:
                    raise MetricsFileError(
                        f"{path}, line {number}, is not a JSON record; remove or repair that "
                        "line (only a torn last line is repaired automatically)"
                    )
                torn = True
                break
            step = record.get("step")
            if isinstance(step, bool) or not isinstance(step, int):
                raise MetricsFileError(
                    f"{path}, line {number}, has no integer step ({line[:80]!r}); remove or "
                    "repair that line"
                )
            records.append((offset, record))
        offset += len(line) + 1
    return records, min(offset, len(data)), torn


class JsonlLogger:
    """Append one JSON object per :meth:`log_dict` call to ``path`` (non-finite → null).

    The file is append-only. A new run (``resume_step`` None) starts it empty. A resumed run
    first cuts it back by truncation, never by rewriting: to the records at or before
    ``resume_step`` that are not :data:`STOP_KEY` records (everything after them was logged
    after the checkpoint and is logged again, identically; ``keep_stop`` keeps a stop record,
    for a resume with nothing left to train), and without a torn last line (a kill in
    mid-write), which is reported on stderr with the file and the step. A kill at any moment
    therefore leaves every record up to the last checkpoint in place.

    Raises:
        MetricsFileError: a line other than the last is damaged (named with its number), or
            the file is a symbolic link.
    """

    def __init__(
        self, path: Path, resume_step: int | None = None, *, keep_stop: bool = False
    ) -> None:
        self.path = Path(path)
        if self.path.is_symlink():
            raise MetricsFileError(
                f"{self.path} is a symbolic link; the metrics are the run's own file (through a "
                "link the run would cut and append to another file): replace it by the file"
            )
        cut = 0 if resume_step is None else resume_cut(self.path, resume_step, keep_stop)
        # O_NOFOLLOW: a link made after the check above is refused, not followed
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        if cut is not None:
            os.ftruncate(fd, cut)
        self._file = os.fdopen(fd, "a", buffering=1)

    def log_dict(self, metrics: dict[str, float], step: int) -> None:
        record = {"step": step, **{k: _finite_or_none(float(v)) for k, v in metrics.items()}}
        line = json.dumps(record) + "\n"
        if faults.armed("log", step):  # test hook: die with half of this line written
            self._file.write(line[: len(line) // 2])
            self._file.flush()
            faults.kill_if_armed("log", step)
        try:
            self._file.write(line)
        except OSError as exc:  # a full disk: name the file
            raise OSError(exc.errno, exc.strerror, str(self.path)) from exc

    def log_config(self, config: dict[str, Any]) -> None:
        """The config lives in ``config.json``; nothing to add to the metric stream."""

    def close(self) -> None:
        self._file.close()


def resume_cut(path: Path, resume_step: int, keep_stop: bool = False) -> int | None:
    """The length to truncate ``path`` to before a run resumes at ``resume_step``: before the
    first record past it or marked :data:`STOP_KEY` (``keep_stop``: a stop record at
    ``resume_step`` stays, for a resume that has nothing left to train).

    None: no file (nothing to cut). Prints a warning naming the file and the step when a torn
    last line is dropped.

    Raises:
        MetricsFileError: a line other than the last is damaged.
    """
    if not path.exists():
        return None
    records, end, torn = _scan(path)
    if torn:
        print(
            f"relmem: warning: {path} ended in a torn line (a write cut by a kill); dropped it, "
            f"resuming at step {resume_step}",
            file=sys.stderr,
            flush=True,
        )
    for offset, record in records:
        if record["step"] > resume_step or (record.get(STOP_KEY) and not keep_stop):
            return offset
    return end


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
    """All complete records of a ``metrics.jsonl`` file, in order (a torn last line is left out).

    Raises:
        OSError: the file cannot be read.
        MetricsFileError: a line other than the last is damaged.
    """
    return [record for _, record in _scan(Path(path))[0]]


def series(
    records: list[dict[str, Any]], key: str, x_key: str, x_scale: float = 1.0
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``(xs, ys)``: ``record[x_key] / x_scale`` and ``record[key]`` of the records that hold
    both (a curve to plot; two empty tuples if none does)."""
    points = [
        (r[x_key] / x_scale, r[key])
        for r in records
        if r.get(key) is not None and r.get(x_key) is not None
    ]
    if not points:
        return (), ()
    xs, ys = zip(*points, strict=True)
    return xs, ys
