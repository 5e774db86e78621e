"""Train the DNC (or the LSTM baseline) on repeat copy on the CPU with the trainer.

The run is the ``repeat-copy`` CPU preset (:func:`relmem.tasks.repeat_copy.repeat_copy_cpu`:
``deepmind/dnc``'s task and model sizes with Adam 1e-3, one CPU thread) under a wall-clock
budget; the trainer writes the run directory (``metrics.jsonl`` with ``train/bit_errors``,
``eval/bit_errors`` by pattern length and repeats, ``summary.json``). Harder variants of the
task and other settings are ``relmem train repeat-copy --task.max-length ...``.

    PYTHONPATH=src python benchmarks/dnc_repeat_copy.py --model dnc --minutes 10
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from relmem.tasks import get_preset
from relmem.train.loop import run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["dnc", "lstm", "rmc"], default="dnc")
    parser.add_argument("--steps", type=int, default=100_000, help="at most this many updates")
    parser.add_argument("--minutes", type=float, default=10.0, help="wall-clock budget")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument(
        "--run-name", help="the run's directory under --out-dir (default: repeat_copy_MODEL-seedS)"
    )
    args = parser.parse_args()

    config = get_preset("repeat-copy", "cpu")
    config.model = args.model
    config.steps = args.steps
    config.time_limit_min = args.minutes
    config.seed = args.seed
    config.device = "cpu"
    config.out_dir = args.out_dir
    config.run_name = args.run_name or f"repeat_copy_{args.model}-seed{args.seed}"
    result = run(config, "repeat-copy")
    print(json.dumps(result.summary, indent=2))


if __name__ == "__main__":
    main()
