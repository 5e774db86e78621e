"""What ``recompute_steps`` saves and costs: MemoReader's memory over long documents, one thread.

The memory controller layer at ``relmem bench --core dnc``'s ``reader-paper`` sizes (D=200, a
GRU controller, N=128, W=64, R=4; batch 8), over ``--tokens`` of input, trained (forward and
backward of the output's sum) whole and in checkpointed chunks of ``--chunks`` steps. Each
setting runs in two fresh processes:

- the peak resident memory that one pass adds to what the process held before it
  (``ru_maxrss``: the true peak, activations, recomputed chunks and gradients together), with
  glibc's mmap threshold fixed at 128 KiB (``MALLOC_MMAP_THRESHOLD_``) so that every larger
  block is mapped and unmapped and the resident memory follows what is allocated (by default
  glibc raises the threshold as blocks are freed and keeps freed blocks of up to 32 MB in its
  heap, which makes the peak depend on the order of frees);
- the median time of ``--repeat`` passes after one untimed pass, with glibc's defaults (what a
  user gets: the fixed threshold makes every chunk's buffers fault their pages in again).

Prints one JSON object.

    python benchmarks/dnc_recompute.py --tokens 800 1600 --chunks 0 25 50 100
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

from relmem.benchmarking.dnc import DNC_CONFIGS
from relmem.cores.dnc import MemoryControllerLayer
from relmem.cores.dnc.fused import load_dnc_ops
from relmem.env_info import machine_info


def _resident_mb() -> float:
    """This process's resident memory now (Linux ``/proc/self/statm``), MB."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def measure(tokens: int, chunk: int, repeat: int, link: str) -> dict[str, float]:
    """One setting in this process: the peak a training pass adds (``repeat`` 0), or the
    median time of ``repeat`` passes after an untimed one."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    load_dnc_ops()
    config = DNC_CONFIGS["reader-paper"]
    layer = MemoryControllerLayer(**config.sizes, link=link, recompute_steps=chunk or None)
    x = torch.randn(tokens, config.shape[1], config.input_size)
    before = _resident_mb()
    times = []
    for i in range(repeat + 1):
        layer.zero_grad(set_to_none=True)
        start = time.perf_counter()
        output, _ = layer(x)
        output.sum().backward()
        if i:  # the first pass builds caches and is not timed
            times.append(time.perf_counter() - start)
    if not repeat:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux
        return {"peak_added_mb": round(peak - before, 1)}
    return {"seconds": round(statistics.median(times), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[800, 1600])
    parser.add_argument(
        "--chunks", type=int, nargs="+", default=[0, 25, 50, 100], help="0: no recomputation"
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--link", choices=["dense", "none"], default="dense")
    parser.add_argument("--one", nargs=2, type=int, help=argparse.SUPPRESS)  # a child process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(*args.one, args.repeat, args.link)))
        return
    rows = []
    for tokens in args.tokens:
        for chunk in args.chunks:
            row: dict[str, object] = {"tokens": tokens, "recompute_steps": chunk or None}
            for repeat, malloc in (
                (0, {"MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}),
                (args.repeat, {}),
            ):
                child = [sys.executable, __file__, "--one", str(tokens), str(chunk)]
                child += ["--repeat", str(repeat), "--link", args.link]
                done = subprocess.run(
                    child, capture_output=True, text=True, check=True, env={**os.environ, **malloc}
                )
                row.update(json.loads(done.stdout))
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    config = DNC_CONFIGS["reader-paper"]
    print(
        json.dumps(
            {
                "machine": machine_info(torch.device("cpu")),
                "sizes": config.sizes,
                "batch": config.shape[1],
                "link": args.link,
                "threads": 1,
                "malloc": "peak: MALLOC_MMAP_THRESHOLD_=131072; time: glibc's defaults",
                "rows": rows,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
