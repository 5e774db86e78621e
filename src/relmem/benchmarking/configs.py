"""The benchmark configurations of ``relmem bench`` and the names of what it times."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FLOOR = "matmul-floor"
PORT = "port"
PYTORCH_DNC = "pytorch-dnc"  # ixaxaar's pytorch-dnc, timed with --core dnc
IMPLEMENTATIONS = (
    "reference",
    "fast",
    "fused",
    "fast+compile",
    "fast+graph",
    "fast+graph+bf16",
    "lstm-params",
    "lstm-width",
    FLOOR,
    PORT,
)


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark configuration: an RMC and the sequence shapes to run it at.

    Attributes:
        rmc: :class:`RelationalMemory` keyword arguments.
        shape: ``(T, B)`` on CUDA (the task's own shape).
        cpu_shape: ``(T, B)`` on the CPU (reduced where the task's shape takes minutes).
        note: where the configuration comes from.
    """

    rmc: dict[str, Any]
    shape: tuple[int, int]
    cpu_shape: tuple[int, int]
    note: str = ""


CONFIGS: dict[str, BenchConfig] = {
    "small": BenchConfig(
        {"input_size": 32, "mem_slots": 4, "head_size": 32, "num_heads": 4},
        (50, 32),
        (50, 32),
        "issue's small core: 4 slots, 4 heads of 32, batch 32 x 50 steps, input 32",
    ),
    "wikitext2_port": BenchConfig(
        {
            "input_size": 192,
            "mem_slots": 1,
            "head_size": 192,
            "num_heads": 4,
            "key_size": 64,
            "attention_mlp_layers": 3,
        },
        (100, 64),
        (100, 64),
        "L0SG/relational-rnn-pytorch WikiText-2 core (docs/targets.md §3.2, "
        "`relmem docs targets 3.2`): batch 64 x BPTT 100",
    ),
    "nth_farthest": BenchConfig(
        {"input_size": 40, "mem_slots": 8, "head_size": 32, "num_heads": 8},
        (8, 1600),
        (8, 64),
        "paper Nth Farthest preset (docs/tasks.md §1, `relmem docs tasks 1`): 8 vectors, "
        "batch 1600",
    ),
    "lte": BenchConfig(
        {
            "input_size": 45,
            "mem_slots": 4,
            "head_size": 128,
            "num_heads": 4,
            "gate_style": "memory",
        },
        (67, 128),
        (67, 8),
        "paper Learning-to-Execute preset (docs/tasks.md §2, `relmem docs tasks 2`): "
        "57 + 10 steps, batch 128",
    ),
    "lm_paper": BenchConfig(
        {
            "input_size": 512,
            "mem_slots": 1,
            "head_size": 625,
            "num_heads": 4,
            "attention_mlp_layers": 5,
        },
        (100, 64),
        (10, 8),
        "paper language-model core (docs/tasks.md §3.4, `relmem docs tasks 3.4`): M=2500, "
        "76 M parameters, BPTT 100",
    ),
}
