"""Keep the small files of a round of runs and print its tables (``docs/results.md``).

A round is several ``relmem train`` runs of one task, run one at a time on a quiet machine
(``benchmarks/quiet_round.sh`` runs the README's headline rows that way and samples the load
average beside each run). ``keep`` copies each run's small files (and its load log, when
given) to ``benchmarks/results/TASK/ROUND/NAME/``; ``table`` prints one row per kept run:
steps, wall time, training speed, the held-out metric of the final and of the best weights
(and ``relmem eval``'s other held-out sets, such as a test set), the load average's range,
and the held-out metric at the largest evaluation step that every run of the table reached
(equal steps beside equal time).

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

KEPT = ("config.json", "run.json", "metrics.jsonl", "summary.json", "eval.json")


def keep(run_dirs: list[Path], to: Path, load_logs: Path | None) -> None:
    """Copy each run's :data:`KEPT` files, its ``plots/curves.png`` when plotted, and
    ``LOAD_LOGS/load-NAME.log`` (NAME the run directory's name) as ``load.log``."""
    for run_dir in run_dirs:
        kept = to / run_dir.name
        kept.mkdir(parents=True, exist_ok=True)
        for name in KEPT:
            shutil.copy(run_dir / name, kept / name)
        curves = run_dir / "plots" / "curves.png"
        if curves.is_file():
            shutil.copy(curves, kept / "curves.png")
        if load_logs is not None:
            shutil.copy(load_logs / f"load-{run_dir.name}.log", kept / "load.log")
        print(f"kept {kept}")


def _evaluations(kept: Path, metric: str) -> dict[int, float]:
    """``{step: held-out metric}`` of every evaluation the run logged."""
    found = {}
    for line in (kept / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if f"eval/{metric}" in record:
            found[int(record["step"])] = float(record[f"eval/{metric}"])
    return found


def _load_range(kept: Path) -> str:
    """The 1-minute load average's range over the run (``load.log``: ``HH:MM:SS 1m 5m 15m``)."""
    log = kept / "load.log"
    if not log.is_file():
        return "not recorded"
    values = [float(line.split()[1]) for line in log.read_text().splitlines() if line.strip()]
    return f"{min(values):.2f}-{max(values):.2f}"


def _speed(summary: dict[str, Any], config: dict[str, Any]) -> str:
    """Training sequences per second, or tokens per second (a language model's windows)."""
    per_second = summary["sequences_seen"] / summary["wall_time_s"]
    return f"{per_second * config['task'].get('bptt', 1):,.0f}"


def _format(value: float, metric: str) -> str:
    return f"{100 * value:.1f}%" if metric in ("accuracy", "solved") else f"{value:.1f}"


def table(round_dir: Path) -> str:
    """The round's markdown table (see the module docstring)."""
    runs = sorted(p for p in round_dir.iterdir() if (p / "summary.json").is_file())
    if not runs:
        raise SystemExit(f"{round_dir}: no kept runs (a folder per run, with summary.json)")
    summaries = [json.loads((p / "summary.json").read_text()) for p in runs]
    metric = summaries[0]["metric"]
    evaluations = [_evaluations(p, metric) for p in runs]
    common = set.intersection(*(set(e) for e in evaluations))
    equal = max(common) if common else None
    others = sorted(json.loads((runs[0] / "eval.json").read_text()).get("more_held_out", {}))
    tokens = "bptt" in json.loads((runs[0] / "config.json").read_text())["task"]
    head = ["run", "model", "seed", "parameters", "steps", "wall",
            "tokens/s" if tokens else "sequences/s", "load 1m",
            f"{metric}, final", f"{metric}, best weights", *(f"{o} (best weights)" for o in others),
            f"{metric} at step {equal:,}" if equal else "equal steps: none"]  # fmt: skip
    solved = "solved" in json.loads((runs[0] / "eval.json").read_text())  # Learning to Execute
    if solved:
        head.insert(10, "solved (best weights)")
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for kept, summary, found in zip(runs, summaries, evaluations, strict=True):
        config = json.loads((kept / "config.json").read_text())
        record: dict[str, Any] = json.loads((kept / "eval.json").read_text())
        final = summary.get(f"held_out_{metric}")
        cells = [
            kept.name,
            summary["model"],
            str(config["seed"]),
            f"{summary['parameters']:,}",
            f"{summary['steps']:,}",
            f"{summary['wall_time_s'] / 60:.1f} min",
            _speed(summary, config),
            _load_range(kept),
            "-" if final is None else _format(final, metric),
            _format(record[metric], metric),
        ]
        if solved:
            cells.append(_format(record["solved"], "solved"))
        more = record.get("more_held_out", {})
        cells += [_format(more[o][metric], metric) for o in others]
        cells.append(_format(found[equal], metric) if equal else "-")
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
        keep(args.run_dirs, args.to, args.load_logs)
    else:
        print(table(args.round_dir))


if __name__ == "__main__":
    main()
