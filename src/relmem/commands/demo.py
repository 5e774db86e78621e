"""``relmem demo``: build a Relational Memory Core and run a batch of sequences through it."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import torch
import tyro

from relmem.cores.rmc import RelationalMemory
from relmem.validation import check_at_least


@dataclass
class DemoArgs:
    """Build a Relational Memory Core and time one forward and backward pass.

    Attributes:
        batch: sequences per batch.
        steps: time steps per sequence.
        input_size: F, features per step.
        mem_slots: N, memory slots.
        head_size: D, value size per head.
        num_heads: H.
        seed: seeds the weights and the inputs.
    """

    batch: int = 32
    steps: int = 20
    input_size: int = 16
    mem_slots: int = 4
    head_size: int = 32
    num_heads: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        check_at_least("--", self, batch=1, steps=1)


def main(argv: list[str]) -> int:
    """Entry point of ``relmem demo``; prints the core, its size and one pass's time."""
    try:
        args = tyro.cli(DemoArgs, args=argv, prog="relmem demo")
    except SystemExit as exc:  # tyro has printed help or a boxed error message
        return int(exc.code or 0)
    torch.manual_seed(args.seed)
    try:
        core = RelationalMemory(args.input_size, args.mem_slots, args.head_size, args.num_heads)
    except ValueError as exc:  # the core names the argument and what it allows
        print(f"relmem demo: error: {exc}", file=sys.stderr)
        return 2
    inputs = torch.randn(args.steps, args.batch, args.input_size)
    start = time.perf_counter()
    outputs, state = core(inputs)
    outputs.sum().backward()
    elapsed = time.perf_counter() - start
    print(core)
    print(f"parameters: {sum(p.numel() for p in core.parameters()):,}")
    print(
        f"input {tuple(inputs.shape)} -> output {tuple(outputs.shape)}, "
        f"final memory {tuple(state.memory.shape)}"
    )
    print(
        f"forward+backward over {args.steps} steps x {args.batch} sequences: {elapsed * 1e3:.1f} ms"
    )
    return 0
