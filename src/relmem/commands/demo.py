"""``relmem demo``: build a Relational Memory Core and run a batch of sequences through it."""

from __future__ import annotations

import argparse
import time

import torch

from relmem.cores.rmc import RelationalMemory


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="relmem demo", description=__doc__)
    parser.add_argument("--batch", type=int, default=32, help="sequences per batch")
    parser.add_argument("--steps", type=int, default=20, help="time steps per sequence")
    parser.add_argument("--input-size", type=int, default=16)
    parser.add_argument("--mem-slots", type=int, default=4)
    parser.add_argument("--head-size", type=int, default=32)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("batch", "steps", "input_size", "mem_slots", "head_size", "num_heads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")

    torch.manual_seed(args.seed)
    core = RelationalMemory(args.input_size, args.mem_slots, args.head_size, args.num_heads)
    inputs = torch.randn(args.steps, args.batch, args.input_size)
    start = time.perf_counter()
    outputs, state = core(inputs)
    outputs.sum().backward()
    elapsed = time.perf_counter() - start
    params = sum(p.numel() for p in core.parameters())
    print(core)
    print(f"parameters: {params:,}")
    print(
        f"input {tuple(inputs.shape)} -> output {tuple(outputs.shape)}, "
        f"final memory {tuple(state.memory.shape)}"
    )
    print(
        f"forward+backward over {args.steps} steps x {args.batch} sequences: {elapsed * 1e3:.1f} ms"
    )
    return 0
