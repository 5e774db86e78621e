"""Train a reader with the ``cpu`` preset on SQuAD articles and keep the run's small files.

One run is ``relmem train squad --model MODEL`` with the ``cpu`` preset (its 30-minute limit
unless ``--minutes``) on the official SQuAD v1.1 dev file split by article (38 articles to
train on, 10 held out, ``--task.held-out-articles 0.2 --task.split-seed 0``: the split a user
without the train file can make, ``docs/reading.md`` §2), then ``relmem eval`` (the official
EM and F1 overall and by context length, and ``eval-predictions-held-out.json``). ``config.json``,
``run.json``, ``metrics.jsonl``, ``summary.json``, ``eval.json`` and the predictions file are
copied to ``benchmarks/results/reading/NAME/``. ``--table`` prints the results tables (overall,
at equal steps, by context length) from those directories.

    PYTHONPATH=src python benchmarks/reading_cpu.py --dev-file dev-v1.1.json --model dnc
    PYTHONPATH=src python benchmarks/reading_cpu.py --table
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

from relmem import cli

RESULTS = Path(__file__).parent / "results" / "reading"  # the default of --results-dir
KEPT = (
    "config.json",
    "run.json",
    "metrics.jsonl",
    "summary.json",
    "eval.json",
    "eval-predictions-held-out.json",
)


def train(args: argparse.Namespace) -> Path:
    """Run and evaluate one reader; copy its small files to ``results/NAME``."""
    name = args.name or args.model
    work = args.work_dir / name
    if work.exists():
        shutil.rmtree(work)
    command = ["train", "squad", "--task.train-file", str(args.dev_file)]
    command += ["--task.held-out-articles", "0.2", "--task.split-seed", "0"]
    command += ["--model", args.model, "--seed", str(args.seed)]
    command += ["--out-dir", str(args.work_dir), "--run-name", name]
    if args.minutes is not None:
        command += ["--time-limit-min", str(args.minutes)]
    if args.steps is not None:
        command += ["--steps", str(args.steps)]
    assert cli.main(command) == 0
    assert cli.main(["eval", str(work), "--device", "cpu"]) == 0
    kept = args.results_dir / name
    kept.mkdir(parents=True, exist_ok=True)
    for file in KEPT:
        shutil.copy(work / file, kept / file)
    (kept / "load.json").write_text(json.dumps({"loadavg_end": os.getloadavg()}) + "\n")
    return kept


def _eval_f1_by_step(kept: Path) -> dict[int, float]:
    values = {}
    for line in (kept / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "eval/f1" in record:
            values[record["step"]] = record["eval/f1"]
    return values


def table(results: Path) -> str:
    """Markdown tables from every run kept in ``results``."""
    runs = sorted(p for p in results.iterdir() if (p / "eval.json").exists())
    lines = [
        "| run | model | steps | training time | questions/s | EM | F1 |",
        "|---|---|---|---|---|---|---|",
    ]
    for kept in runs:
        summary = json.loads((kept / "summary.json").read_text())
        record = json.loads((kept / "eval.json").read_text())
        official = record["official"]["all"]
        steps = summary["steps"]
        batch = json.loads((kept / "config.json").read_text())["batch_size"]
        rate = steps * batch / summary["wall_time_s"]
        lines.append(
            f"| {kept.name} | {record['model']} | {steps:,} | "
            f"{summary['wall_time_s'] / 60:.1f} min | {rate:.1f} | "
            f"{official['exact_match']:.1f} | {official['f1']:.1f} |"
        )
    curves = {kept.name: _eval_f1_by_step(kept) for kept in runs}
    shared = sorted(set.intersection(*(set(c) for c in curves.values()))) if curves else []
    lines += ["", "| held-out F1 at step | " + " | ".join(curves) + " |"]
    lines += ["|---|" + "---|" * len(curves)]
    for step in shared:
        cells = " | ".join(f"{100 * curves[name][step]:.1f}" for name in curves)
        lines.append(f"| {step:,} | {cells} |")
    labels = list(json.loads((runs[0] / "eval.json").read_text())["official"]) if runs else []
    lines += ["", "| context length | questions | " + " | ".join(curves) + " (EM / F1) |"]
    lines += ["|---|---|" + "---|" * len(curves)]
    for label in labels:
        cells, count = [], 0
        for kept in runs:
            scores = json.loads((kept / "eval.json").read_text())["official"][label]
            count = int(scores["total"])
            cells.append(f"{scores['exact_match']:.1f} / {scores['f1']:.1f}")
        lines.append(f"| {label} | {count:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dev-file", type=Path, help="the official SQuAD v1.1 dev file")
    parser.add_argument("--model", choices=["dnc", "none", "rmc", "lstm"], default="dnc")
    parser.add_argument("--minutes", type=float, help="time limit (default: the preset's 30)")
    parser.add_argument("--steps", type=int, help="step limit (default: the preset's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", help="the run's name (default: the model's)")
    parser.add_argument("--work-dir", type=Path, default=Path("runs"))
    parser.add_argument("--results-dir", type=Path, default=RESULTS)
    parser.add_argument("--table", action="store_true", help="print the results tables and exit")
    args = parser.parse_args()
    if args.table:
        print(table(args.results_dir))
        return
    if args.dev_file is None:
        parser.error("--dev-file is required to train")
    print(f"kept {train(args)}")


if __name__ == "__main__":
    main()
