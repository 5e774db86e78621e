"""Plot ``relmem bench`` results: forward+backward time per configuration and implementation.

Reads only the JSON files that ``relmem bench`` writes (``benchmarks/results/bench-*.json``)
and draws one grouped bar chart per file, on a log scale, with each bar's ratio to the
equal-parameter ``nn.LSTM`` written above it.

Usage::

    PYTHONPATH=src python benchmarks/plot_bench.py benchmarks/results/bench-cpu-*.json \
        [--out plot.png]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

from relmem.benchmarking.configs import IMPLEMENTATIONS
from relmem.benchmarking.report import first_records, load_results, machine_label, train_medians

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot(path: Path, out: Path) -> None:
    """Draw the grouped bar chart of one result file to ``out``."""
    payload = load_results(path)
    by_config = train_medians(payload["results"])
    impls = [i for i in IMPLEMENTATIONS if any(i in row for row in by_config.values())]
    width = 0.8 / len(impls)
    fig, ax = plt.subplots(figsize=(2.2 * len(by_config) + 2, 4.5))
    for j, impl in enumerate(impls):
        offset = (j - (len(impls) - 1) / 2) * width
        rows = [(i, row) for i, row in enumerate(by_config.values()) if impl in row]
        ax.bar([i + offset for i, _ in rows], [row[impl] for _, row in rows], width, label=impl)
        for i, row in rows:
            lstm = row.get("lstm-params")
            if lstm and not impl.startswith("lstm"):
                ax.text(
                    i + offset,
                    row[impl],
                    f"{row[impl] / lstm:.3g}×",
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    rotation=90,
                )
    machine = payload["machine"]
    device = machine_label(machine)
    ax.set_xticks(range(len(by_config)))
    ax.set_xticklabels(
        [f"{c}\n{r['steps']}×{r['batch']}" for c, r in first_records(payload["results"]).items()]
    )
    ax.set_yscale("log")
    ax.set_ylim(top=ax.get_ylim()[1] * 3)  # room for the ratio labels
    ax.set_ylabel("forward + backward, median ms")
    ax.set_title(
        f"RMC vs nn.LSTM ({device}, torch {machine['torch']}); labels: ÷ equal-parameter LSTM",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument(
        "--out",
        type=Path,
        help="where the PNGs go: a PNG file for one input, or a directory (default: beside "
        "each JSON)",
    )
    args = parser.parse_args()
    if args.out is not None and len(args.files) > 1 and args.out.suffix == ".png":
        parser.error("--out: give a directory for several input files, not one PNG")
    for path in args.files:
        out = path.with_suffix(".png")
        if args.out is not None:
            out = args.out if args.out.suffix == ".png" else args.out / out.name
            out.parent.mkdir(parents=True, exist_ok=True)
        plot(path, out)


if __name__ == "__main__":
    main()
