"""The DNC's options from Csordás & Schmidhuber 2019 on the fused step against the reference.

``relmem.DNC`` at the ``copy`` preset's sizes (``relmem bench --core dnc``'s ``copy``: N=32,
W=16, R=1, an LSTM controller of 64, batch 16 over 43 steps) with each of ``dealloc_content``,
``key_mask`` and ``link_sharpness``, and all three; the fused path and the reference side by side,
forward + backward (and forward alone), one thread, the bench's interleaved rounds and its kept
heap (:mod:`relmem.benchmarking.timing`). Prints one JSON object.

    python benchmarks/dnc_options.py --repeat 5
"""

from __future__ import annotations

import argparse
import json

import torch

from relmem.benchmarking.dnc import DNC_CONFIGS
from relmem.benchmarking.timing import keep_freed_memory, time_modules
from relmem.cores.dnc import DNC
from relmem.env_info import machine_info

OPTIONS = {
    "none": {},
    "dealloc_content": {"dealloc_content": True},
    "key_mask": {"key_mask": True},
    "link_sharpness": {"link_sharpness": True},
    "all three": {"dealloc_content": True, "key_mask": True, "link_sharpness": True},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    heap = keep_freed_memory()
    device = torch.device("cpu")
    config = DNC_CONFIGS["copy"]
    steps, batch = config.shape
    torch.manual_seed(1)
    inputs = torch.randn(steps, batch, config.input_size)
    rows = []
    for name, options in OPTIONS.items():
        torch.manual_seed(0)
        modules = {
            implementation: DNC(**config.sizes, **options, implementation=implementation)
            for implementation in ("reference", "fused")
        }
        modules["fused"].load_state_dict(modules["reference"].state_dict())
        timings = time_modules(modules, inputs, {}, device, args.warmup, args.repeat)
        row = {"options": name}
        for implementation, timing in timings.items():
            row[implementation] = {
                "train_ms": round(timing["train"]["median_ms"], 2),
                "forward_ms": round(timing["forward"]["median_ms"], 2),
            }
        row["reference / fused"] = round(row["reference"]["train_ms"] / row["fused"]["train_ms"], 2)
        print(json.dumps(row), flush=True)
        rows.append(row)
    info = machine_info(device)
    info["freed_memory"] = heap
    print(json.dumps({"machine": info, "config": "copy", "sizes": config.sizes, "rows": rows}))


if __name__ == "__main__":
    main()
