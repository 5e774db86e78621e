"""Reporting ``relmem bench`` results: progress rows, the summary table, the JSON files.

A result file (``bench-<device>-<UTC time>.json``) holds ``machine``
(:func:`relmem.env_info.machine_info`), ``argv``, ``warmup``, ``repeat``, ``finished_utc``,
``load_average_end``, ``results`` (one record per configuration and implementation, see
:func:`relmem.benchmarking.runner.run_config`) and ``table`` (:func:`summary`).
``benchmarks/plot_bench.py`` reads them back with :func:`load_results`.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from relmem.benchmarking.configs import FLOOR, PORT, PYTORCH_DNC

_COLUMNS = ("config", "implementation", "fwd ms", "fwd+bwd ms", "items/s")


def progress_header() -> str:
    """The header of the rows :func:`progress_row` prints while the bench runs."""
    c = _COLUMNS
    return f"{c[0]:<15} {c[1]:<16} {c[2]:>10} {c[3]:>12} {c[4]:>12}"


def progress_row(record: dict[str, Any]) -> str:
    """One record as a line: config, implementation, fwd and fwd+bwd median ms, items/s."""
    return (
        f"{record['config']:<15} {record['implementation']:<16} "
        f"{record['forward']['median_ms']:>10.2f} {record['train']['median_ms']:>12.2f} "
        f"{record['train']['items_per_s']:>12.0f}"
    )


def train_medians(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Forward + backward median ms per configuration and implementation, in record order."""
    medians: dict[str, dict[str, float]] = {}
    for record in records:
        medians.setdefault(record["config"], {})[record["implementation"]] = record["train"][
            "median_ms"
        ]
    return medians


def summary(records: list[dict[str, Any]]) -> str:
    """A Markdown table: per configuration and implementation, ms and ratios."""
    others = ["lstm-params", "lstm-width", FLOOR, PORT]
    if any(record["implementation"] == PYTORCH_DNC for record in records):
        others.append(PYTORCH_DNC)
    lines = [
        "| config | T×B | implementation | fwd ms | fwd+bwd ms | fwd+bwd steps·batch/s | "
        + " | ".join(f"÷ {other}" for other in others)
        + " | reference ÷ this |",
        "|---|---|---|---:|---:|---:|" + "---:|" * (len(others) + 1),
    ]
    by_config: dict[str, dict[str, dict[str, Any]]] = {}
    for record in records:
        by_config.setdefault(record["config"], {})[record["implementation"]] = record
    medians = train_medians(records)
    for config, impls in by_config.items():
        train_ms = medians[config]
        for impl, record in impls.items():
            ms = train_ms[impl]
            cells = []
            for other in others:
                cells.append(f"{ms / train_ms[other]:.2f}×" if other in train_ms else "–")
            ref = train_ms.get("reference")
            cells.append(f"{ref / ms:.2f}×" if ref else "–")
            lines.append(
                f"| {config} | {record['steps']}×{record['batch']} | {impl} "
                f"| {record['forward']['median_ms']:.1f} | {ms:.1f} "
                f"| {record['train']['items_per_s']:.0f} | " + " | ".join(cells) + " |"
            )
    return "\n".join(lines)


def prepare_out_dir(out: Path) -> None:
    """Create the directory ``out`` (and its parents) if it is missing and check that a file
    can be written in it; ``relmem bench`` does so before timing, so that a bad ``--out`` costs
    no timings.

    Raises:
        ValueError: ``out`` is a file, or cannot be created or written in (the message names
            ``--out``, ``out`` and the system's reason).
    """
    try:
        out.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=out).close()
    except FileExistsError:  # from mkdir: something that is not a directory has its name
        raise ValueError(
            f"--out {out} exists and is not a directory; give a directory for the results"
        ) from None
    except OSError as exc:
        raise ValueError(
            f"--out {out}: {exc.strerror or exc}; give a directory the results can be written in"
        ) from None


def write_results(
    out: Path, device_type: str, payload: dict[str, Any], *, now: dt.datetime | None = None
) -> Path:
    """Write ``payload`` to ``out/bench-<device_type>-<UTC time>.json``; return the path.

    Args:
        out: a directory :func:`prepare_out_dir` has accepted.
        device_type: ``cpu`` or ``cuda``, for the name.
        payload: the file's content but for the two keys added: ``finished_utc`` (the time in
            the name) and ``load_average_end``.
        now: the time to record (default: now).
    """
    now = now or dt.datetime.now(dt.timezone.utc)
    stamp = now.strftime("%Y%m%dT%H%M%SZ")
    load = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    path = out / f"bench-{device_type}-{stamp}.json"
    path.write_text(
        json.dumps({**payload, "finished_utc": stamp, "load_average_end": load}, indent=1)
    )
    return path


def load_results(path: Path) -> dict[str, Any]:
    """A result file written by :func:`write_results`."""
    return json.loads(Path(path).read_text())


def first_records(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The first record of each configuration (its shape and settings), in record order."""
    first: dict[str, dict[str, Any]] = {}
    for record in records:
        first.setdefault(record["config"], record)
    return first


def machine_label(machine: dict[str, Any]) -> str:
    """The GPU's name, or the CPU's with its thread count, from a file's ``machine``."""
    return machine.get("gpu") or f"{machine['cpu']}, {machine['torch_threads']} thread(s)"
