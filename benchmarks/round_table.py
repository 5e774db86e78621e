"""Keep the small files of a round of runs and print its tables (``docs/results.md``).

A round is several ``relmem train`` runs of one task, run one at a time on a quiet machine
(``benchmarks/quiet_round.sh`` runs the README's headline rows that way and samples the load
average beside each run). ``keep`` copies each run's small files (and its load log, when
given) to ``benchmarks/results/TASK/ROUND/NAME/``; ``table`` prints one row per kept run:
steps, wall time, training speed, the load average's range, the held-out metric of the final
weights, ``relmem eval``'s (of the best weights where the task keeps them, else of the last
checkpoint; with the step of the weights it evaluated, and its other held-out sets, such as a
test set), and the held-out metric at the largest evaluation step that every run of the table
reached (equal steps beside equal time).

    python benchmarks/round_table.py keep RUN_DIR... --to benchmarks/results/lm/ROUND \\
        [--load-logs DIR]
    python benchmarks/round_table.py table benchmarks/results/lm/ROUND
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

from relmem.train.metrics import read_metrics, series

KEPT = ("config.json", "run.json", "metrics.jsonl", "summary.json", "eval.json")


def keep(run_dir: Path, kept: Path, load_log: Path | None = None) -> None:
    """Copy one run's :data:`KEPT` files, its ``plots/curves.png`` when plotted, and
    ``load_log`` (when given) as ``load.log`` into the folder ``kept``."""
    kept.mkdir(parents=True, exist_ok=True)
    for name in KEPT:
        shutil.copy(run_dir / name, kept / name)
    curves = run_dir / "plots" / "curves.png"
    if curves.is_file():
        shutil.copy(curves, kept / "curves.png")
    if load_log is not None:
        shutil.copy(load_log, kept / "load.log")
    print(f"kept {kept}")


def _evaluations(kept: Path, metric: str) -> dict[int, float]:
    """``{step: held-out metric}`` of every evaluation the run logged."""
    steps, values = series(read_metrics(kept / "metrics.jsonl"), f"eval/{metric}", "step")
    return {int(step): float(value) for step, value in zip(steps, values, strict=True)}


def _load_range(kept: Path) -> str:
    """The 1-minute load average's range over the run (``load.log``: ``HH:MM:SS 1m 5m 15m``)."""
    log = kept / "load.log"
    if not log.is_file():
        return "not recorded"
    values = [float(line.split()[1]) for line in log.read_text().splitlines() if line.strip()]
    return f"{min(values):.2f}-{max(values):.2f}"


def _speed(summary: dict[str, Any], config: dict[str, Any]) -> tuple[str, str]:
    """``(unit, figure)``: an RL run's frames, a language model's tokens (its windows times
    ``bptt``), or else the training sequences, per second of the run."""
    if "frames_seen" in summary:
        return "frames/s", f"{summary['frames_seen'] / summary['wall_time_s']:,.0f}"
    if "bptt" in config["task"]:
        per_second = summary["sequences_seen"] * config["task"]["bptt"] / summary["wall_time_s"]
        return "tokens/s", f"{per_second:,.0f}"
    return "sequences/s", f"{summary['sequences_seen'] / summary['wall_time_s']:,.0f}"


def _evaluated(record: dict[str, Any], metric: str) -> float:
    """``relmem eval``'s held-out metric (of the best weights where the task keeps them, else
    of the last checkpoint; an RL run's is its agent's, on the test levels)."""
    return float(record["agent"][metric] if "agent" in record else record[metric])


def _step(record: dict[str, Any]) -> str:
    """`` (STEP)``, the step of the weights ``relmem eval`` used, where it recorded it."""
    return f" ({record['step']:,})" if "step" in record else ""


def _format(value: float, metric: str) -> str:
    """A percentage for a rate; otherwise one decimal, or three significant digits below 10
    (a few bit errors per sequence)."""
    if metric in ("accuracy", "solved"):
        return f"{100 * value:.1f}%"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"


def table(round_dir: Path) -> str:
    """The round's markdown table (see the module docstring)."""
    runs = sorted(p for p in round_dir.iterdir() if (p / "summary.json").is_file())
    if not runs:
        raise SystemExit(f"{round_dir}: no kept runs (a folder per run, with summary.json)")
    summaries, configs, records = (
        [json.loads((p / name).read_text()) for p in runs]
        for name in ("summary.json", "config.json", "eval.json")
    )
    metric = summaries[0]["metric"]
    evaluations = [_evaluations(p, metric) for p in runs]
    common = set.intersection(*(set(e) for e in evaluations))
    equal = max(common) if common else None
    others = sorted(records[0].get("more_held_out", {}))
    solved = "solved" in records[0]  # Learning to Execute
    head = ["run", "model", "seed", "parameters", "steps", "wall",
            _speed(summaries[0], configs[0])[0], "load 1m",
            f"{metric}, final", f"{metric}, relmem eval (weights' step)",
            *(["solved, relmem eval"] if solved else []),
            *(f"{o}, relmem eval" for o in others),
            f"{metric} at step {equal:,}" if equal else "equal steps: none"]  # fmt: skip
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for kept, summary, config, record, found in zip(
        runs, summaries, configs, records, evaluations, strict=True
    ):
        final = summary.get(f"held_out_{metric}")
        cells = [
            kept.name,
            summary["model"],
            str(config["seed"]),
            f"{summary['parameters']:,}",
            f"{summary['steps']:,}",
            f"{summary['wall_time_s'] / 60:.1f} min",
            _speed(summary, config)[1],
            _load_range(kept),
            "-" if final is None else _format(final, metric),
            _format(_evaluated(record, metric), metric) + _step(record),
            *([_format(record["solved"], "solved")] if solved else []),
            *(_format(record["more_held_out"][o][metric], metric) for o in others),
            _format(found[equal], metric) if equal else "-",
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    keeping = sub.add_parser("keep", help="copy the runs' small files")
    keeping.add_argument("run_dirs", type=Path, nargs="+")
    keeping.add_argument("--to", type=Path, required=True, help="the round's results folder")
    keeping.add_argument("--load-logs", type=Path, help="the folder of load-NAME.log files")
    tabling = sub.add_parser("table", help="print the round's markdown table")
    tabling.add_argument("round_dir", type=Path)
    args = parser.parse_args()
    if args.command == "keep":
        for run_dir in args.run_dirs:
            logs = args.load_logs
            keep(run_dir, args.to / run_dir.name, logs and logs / f"load-{run_dir.name}.log")
    else:
        print(table(args.round_dir))


if __name__ == "__main__":
    main()
