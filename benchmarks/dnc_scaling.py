"""Time and memory per DNC step as the number of memory slots N grows, per link variant.

For each N in ``--slots`` and each link in ``--links`` ('dense', 'sparse' with K =
``--topk``, 'none'), a fresh subprocess builds a small DNC and runs a ``--seq-len``-step
sequence forward and backward ``--repeats`` times. It reports, per time step:

- ``forward_ms`` / ``train_ms``: median wall time of the forward pass and of forward +
  backward, divided by the sequence length;
- ``state_bytes``: the size of one ``DNCState`` (what a carried state costs);
- ``saved_bytes_per_step``: bytes of the distinct tensors autograd saves for backward (counted
  with ``torch.autograd.graph.saved_tensors_hooks``, each storage once), divided by the
  sequence length. This is the activation memory that grows with T;
- ``peak_rss_delta_mb``: the process's peak resident memory (``ru_maxrss``) after the first
  forward + backward minus before it; it includes temporaries and allocator caching, so it is
  a coarse upper bound on the sequence's working memory (not divided by T).

One JSON object per configuration, with machine info, is appended to ``--out``
(``benchmarks/results/dnc_scaling.jsonl``) and a table is printed.

    PYTHONPATH=src python benchmarks/dnc_scaling.py
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from relmem import DNC
from relmem.env_info import machine_info


def measure(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = DNC(
        args.input_size,
        args.hidden,
        memory_size=args.single_slots,
        word_size=args.word,
        num_read_heads=args.reads,
        num_write_heads=1,
        output_size=args.input_size,
        link=args.single_link,
        link_topk=min(args.topk, args.single_slots),
    )
    x = torch.randn(args.seq_len, args.batch, args.input_size)
    state = model.initial_state(args.batch)
    state_bytes = sum(leaf.numel() * leaf.element_size() for leaf in _leaves(state))

    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:  # weights are not activation memory
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        output, _ = model(x, state)
    saved_bytes = sum(saved.values())
    output.sum().backward()
    del output
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    for _ in range(args.warmup):
        output, _ = model(x, state)
        output.sum().backward()
    forward, train = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        with torch.no_grad():
            model(x, state)
        forward.append(time.perf_counter() - start)
        start = time.perf_counter()
        output, _ = model(x, state)
        output.sum().backward()
        train.append(time.perf_counter() - start)
    return {
        "slots": args.single_slots,
        "link": args.single_link,
        "topk": args.topk if args.single_link == "sparse" else None,
        "forward_ms": 1e3 * statistics.median(forward) / args.seq_len,
        "train_ms": 1e3 * statistics.median(train) / args.seq_len,
        "state_bytes": state_bytes,
        "saved_bytes_per_step": saved_bytes / args.seq_len,
        "peak_rss_delta_mb": (rss_after - rss_before) / 1024,  # ru_maxrss is in KiB on Linux
    }


def _leaves(state: object) -> list[torch.Tensor]:
    """Every tensor of a (nested) state tuple."""
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, tuple):
        return [leaf for item in state for leaf in _leaves(item)]
    return []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, nargs="+", default=[64, 256, 1024, 4096])
    parser.add_argument(
        "--links",
        nargs="+",
        choices=["dense", "sparse", "none"],
        default=["dense", "sparse", "none"],
    )
    parser.add_argument("--topk", type=int, default=8)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--word", type=int, default=8)
    parser.add_argument("--reads", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--input-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "dnc_scaling.jsonl"
    )
    parser.add_argument("--single-slots", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--single-link", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.single_slots is not None:  # child process: one configuration
        print(json.dumps(measure(args)))
        return

    info = {"device": "cpu", **machine_info(torch.device("cpu"))}
    keys = ("batch", "word", "reads", "hidden", "seq_len", "threads")
    shape = {key: getattr(args, key) for key in keys}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(
        f"{'N':>6} {'link':>7} {'fwd ms/step':>12} {'train ms/step':>14} "
        f"{'state MB':>9} {'saved MB/step':>14} {'peak RSS +MB':>13}"
    )
    with args.out.open("a") as out:
        for slots in args.slots:
            for link in args.links:
                child = [sys.executable, __file__, *sys.argv[1:]]
                child += ["--single-slots", str(slots), "--single-link", link]
                result = subprocess.run(child, capture_output=True, text=True, check=True)
                row = json.loads(result.stdout.strip().splitlines()[-1])
                out.write(json.dumps({**row, **shape, "dtype": "float32", **info}) + "\n")
                out.flush()
                state_mb = row["state_bytes"] / 2**20
                saved_mb = row["saved_bytes_per_step"] / 2**20
                print(
                    f"{slots:>6} {link:>7} {row['forward_ms']:>12.2f} {row['train_ms']:>14.2f} "
                    f"{state_mb:>9.3f} {saved_mb:>14.2f} {row['peak_rss_delta_mb']:>13.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
