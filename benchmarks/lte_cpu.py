"""Train on Learning to Execute with a CPU preset and keep the run's small files.

One run is ``relmem train lte --preset cpu-TASK --model MODEL`` (``cpu`` for full programs;
:mod:`relmem.tasks.learn_to_execute.presets`) under a wall-clock budget in a work directory;
then ``relmem eval`` (the held-out set, and the breakdown by length and nesting) and ``relmem
plot``; ``round_table.keep`` copies the run's small files to
``benchmarks/results/lte/TASK-MODEL/``, and ``baseline.json`` beside them holds the score of
guessing from the output length alone. ``--table`` prints the README's table from those
directories.

    PYTHONPATH=src python benchmarks/lte_cpu.py --task addition --model rmc --minutes 10
    PYTHONPATH=src python benchmarks/lte_cpu.py --table
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timezone
from pathlib import Path

from round_table import keep  # benchmarks/round_table.py, beside this script

from relmem import cli
from relmem.tasks import get_preset, get_task
from relmem.tasks.learn_to_execute.programs import TASKS
from relmem.train.loop import run

RESULTS = Path(__file__).parent / "results" / "lte"  # the default of --results-dir


def train(
    task_type: str, model: str, minutes: float, work_dir: Path, results: Path, run_name: str
) -> Path:
    """Run, evaluate and plot one configuration in ``work_dir / run_name``; copy its small
    files to ``results``."""
    config = get_preset("lte", "cpu" if task_type == "program" else f"cpu-{task_type}")
    config.model, config.time_limit_min, config.device = model, minutes, "cpu"
    config.out_dir, config.run_name = work_dir, run_name
    result = run(config, "lte")
    assert cli.main(["eval", str(result.run_dir), "--device", "cpu"]) == 0
    assert cli.main(["plot", str(result.run_dir)]) == 0
    kept = results / f"{task_type}-{model}"
    keep(result.run_dir, kept)
    accuracy, solved = get_task("lte").build(config.task).length_only_baseline()
    baseline = {"accuracy": accuracy, "solved": solved, "what": "output length alone"}
    (kept / "baseline.json").write_text(json.dumps(baseline, indent=2) + "\n")
    return kept


def table(results: Path) -> str:
    """A markdown row per run kept in ``results``: steps, wall time, held-out accuracy and
    solved rate."""
    rows = [
        "| task | model | steps | wall time | per-char accuracy | solved | length alone |",
        "|---|---|---|---|---|---|---|",
    ]
    for kept in sorted(p.parent for p in results.glob("*/baseline.json")):  # this script's
        summary = json.loads((kept / "summary.json").read_text())
        baseline = json.loads((kept / "baseline.json").read_text())
        task = json.loads((kept / "config.json").read_text())["task"]
        accuracy, solved = summary["held_out_accuracy"], summary["held_out_solved"]
        rows.append(
            f"| {task['task_type']} (L={task['max_length']}, N={task['max_nesting']}) "
            f"| {summary['model']} | {summary['steps']:,} | {summary['wall_time_s'] / 60:.1f} min "
            f"| {100 * accuracy:.1f}% | {100 * solved:.1f}% | {100 * baseline['accuracy']:.1f}% |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=TASKS, default="program", help="an LTE task type")
    parser.add_argument("--model", choices=["rmc", "lstm", "dnc"], default="rmc")
    parser.add_argument("--minutes", type=float, default=10.0, help="wall-clock budget")
    parser.add_argument("--work-dir", type=Path, default=Path("runs"))
    parser.add_argument(
        "--run-name", help="the run's directory under --work-dir (default: TASK-MODEL-UTC time)"
    )
    parser.add_argument(
        "--results-dir", type=Path, default=RESULTS, help="where the small files are kept"
    )
    parser.add_argument("--table", action="store_true", help="print the results table and exit")
    args = parser.parse_args()
    if args.table:
        print(table(args.results_dir))
        return
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    run_name = args.run_name or f"{args.task}-{args.model}-{stamp}"
    kept = train(args.task, args.model, args.minutes, args.work_dir, args.results_dir, run_name)
    print(f"kept {kept}")


if __name__ == "__main__":
    main()
