"""The fused GRU sequence against ``nn.GRU``, its reference, at the reader's shapes, one thread.

Each shape is one ``nn.GRU`` direction as the ``squad`` readers run it: the ``cpu`` preset's
encoder and span-head directions (48 units over 96- and 192-wide rows, batch-first), the
memory controller layer's backward direction (96 units over 160-wide rows, time-major), and the
``paper`` preset's encoder direction (100 units over 200-wide rows). Forward + backward (the
output's sum) and forward alone under ``no_grad``; the implementations take turns, and each
figure is the median of ``--repeat`` rounds. Prints one JSON object.

    python benchmarks/gru_sequence.py --steps 200 --repeat 9
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch
from torch import nn

from relmem.cores.gru import fused_gru

# name: (batch, inputs, hidden, batch_first)
SHAPES = {
    "reader-cpu-encoder": (32, 96, 48, True),
    "reader-cpu-end-head": (32, 192, 48, True),
    "reader-cpu-controller-backward": (32, 160, 96, False),
    "reader-paper-encoder": (32, 200, 100, True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="sequence length")
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    results = {}
    for name, (batch, inputs, hidden, batch_first) in SHAPES.items():
        module = nn.GRU(inputs, hidden, batch_first=batch_first)
        shape = (batch, args.steps, inputs) if batch_first else (args.steps, batch, inputs)
        x = torch.randn(*shape, requires_grad=True)
        runs = {
            "nn.GRU": lambda x=x, m=module: m(x)[0],
            "fused": lambda x=x, m=module: fused_gru(x, m),
        }

        def train(run) -> None:
            run().sum().backward()

        def infer(run) -> None:
            with torch.no_grad():
                run()

        times: dict[str, list[float]] = {f"{k} {m}": [] for k in runs for m in ("train", "infer")}
        for _ in range(args.repeat + 1):  # the first round warms up
            for key, run in runs.items():
                for mode, call in (("train", train), ("infer", infer)):
                    start = time.perf_counter()
                    call(run)
                    times[f"{key} {mode}"].append(time.perf_counter() - start)
        median = {k: statistics.median(v[1:]) * 1e3 for k, v in times.items()}
        results[name] = {
            "shape": {"batch": batch, "steps": args.steps, "inputs": inputs, "hidden": hidden},
            "median_ms": median,
            "speedup_train": median["nn.GRU train"] / median["fused train"],
            "speedup_infer": median["nn.GRU infer"] / median["fused infer"],
        }
    print(json.dumps({
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": 1,
        "load_average": os.getloadavg(),
        "results": results,
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
