"""The Relational Memory Core as a trainer core (``--model rmc``).

Its per-step output is the flattened memory ``[B, T, N·M]``, so a 'last' head reads the final
memory of each sequence, as the paper's Nth Farthest model does (``docs/tasks.md`` §1.3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from relmem.cores.rmc import RelationalMemory, RMCConfig
from relmem.cores.rmc.config import IMPLEMENTATIONS, Implementation
from relmem.models.registry import register_model
from relmem.validation import check_at_least, check_choice


@dataclass
class RMCModelConfig:
    """RMC core settings (see :class:`relmem.cores.rmc.RelationalMemory`).

    Attributes:
        mem_slots: N, memory slots.
        head_size: D, value size per head.
        num_heads: H; the slot width is M = H·D.
        num_blocks: attention + MLP blocks per step.
        key_size: query/key size per head; None means D.
        attention_mlp_layers: L, depth of the row-wise MLP.
        gate_style: 'unit' (per element), 'memory' (per slot) or 'none'.
        forget_bias: constant added to the forget gate's pre-activation.
        input_bias: constant added to the input gate's pre-activation.
        implementation: 'fast', 'fused' (the fast path's step in C++ operators, CPU only,
            compiled on first use), 'reference', or 'auto': in a training run, 'fused' on the
            CPU when its operators build and 'fast' otherwise (elsewhere 'fast'). Every one
            computes the same function (``docs/performance.md`` §4.8).
    """

    mem_slots: int = 8
    head_size: int = 32
    num_heads: int = 8
    num_blocks: int = 1
    key_size: int | None = None
    attention_mlp_layers: int = 2
    gate_style: Literal["unit", "memory", "none"] = "unit"
    forget_bias: float = 1.0
    input_bias: float = 0.0
    implementation: Implementation = "auto"

    def __post_init__(self) -> None:
        check_at_least(
            "rmc.",
            self,
            mem_slots=1,
            head_size=1,
            num_heads=1,
            num_blocks=1,
            attention_mlp_layers=1,
        )
        check_choice("rmc.gate_style", self.gate_style, ("unit", "memory", "none"))
        check_choice("rmc.implementation", self.implementation, IMPLEMENTATIONS)


def rmc_config(config: RMCModelConfig, input_size: int, input_rows: int | None = None) -> RMCConfig:
    """The core's :class:`RMCConfig` for ``config`` over ``input_size`` features (per row, with
    ``input_rows`` rows per step in matrix mode; the RL agent's one row per cell)."""
    return RMCConfig(
        input_size,
        config.mem_slots,
        config.head_size,
        config.num_heads,
        config.num_blocks,
        forget_bias=config.forget_bias,
        input_bias=config.input_bias,
        gate_style=None if config.gate_style == "none" else config.gate_style,
        attention_mlp_layers=config.attention_mlp_layers,
        key_size=config.key_size,
        input_rows=input_rows,
    )


@register_model("rmc", RMCModelConfig)
def build_rmc(config: RMCModelConfig, input_size: int, readout_size: None) -> RelationalMemory:
    """A batch-first :class:`RelationalMemory`: ``[B, T, F] -> [B, T, N·M]``."""
    return RelationalMemory.from_config(
        rmc_config(config, input_size), batch_first=True, implementation=config.implementation
    )
