"""The Relational Memory Core's configuration, state and step details: plain data, no modules.

Notation (``docs/rmc.md`` §1): B batch, T time, N ``mem_slots``, H ``num_heads``, D ``head_size``,
K ``key_size``, M = H·D the slot width, Q = H·(2K + D) the qkv width, n input rows per step,
F input features (per row in matrix mode), g the gate width (M for 'unit', 1 for 'memory').
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal, NamedTuple

from torch import Tensor

from relmem.validation import as_int, check_bool, check_int

GateStyle = Literal["unit", "memory"] | None
QueryRows = Literal["all", "memory"]
Implementation = Literal["auto", "reference", "fast", "fused"]
IMPLEMENTATIONS = ("auto", "reference", "fast", "fused")


def check_implementation(name: str, implementation: str) -> str:
    """Return ``implementation`` if it is one of :data:`IMPLEMENTATIONS`; raise otherwise."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"{name}: implementation must be one of {', '.join(map(repr, IMPLEMENTATIONS))}, "
            f"got {implementation!r}"
        )
    return implementation


class RMCState(NamedTuple):
    """The recurrent state of a Relational Memory Core.

    Attributes:
        memory: ``[B, N, M]`` the memory matrix ``m_t``.
        hidden: ``[B, N, M]`` the output-gated ``h_t`` (``docs/rmc.md`` §9.2), present only when
            ``output_gate=True``; otherwise None.
    """

    memory: Tensor
    hidden: Tensor | None = None


class RMCStepDetails(NamedTuple):
    """Introspection for one step, returned with ``return_details=True`` (``docs/rmc.md`` §4.9).

    Attributes:
        input_gate: ``[B, N, g]`` σ(i + input_bias), or None when ``gate_style=None``.
        forget_gate: ``[B, N, g]`` σ(f + forget_bias), or None when ``gate_style=None``.
        output_gate: ``[B, N, g]`` σ(o + output_bias) with ``output_gate=True``, else None.
        attention: one ``[B, H, R_q, N + n]`` softmax weight tensor per block, where R_q is
            the number of query rows (N + n, or N with ``query_rows='memory'``). Key columns
            0..N-1 are the memory slots and N..N+n-1 the input rows.
    """

    input_gate: Tensor | None
    forget_gate: Tensor | None
    output_gate: Tensor | None
    attention: tuple[Tensor, ...]


@dataclass(frozen=True)
class RMCConfig:
    """Every hyper-parameter of a Relational Memory Core (``docs/rmc.md`` §2 and §9).

    The modules' constructors take these same arguments, in this order (``input_size`` to
    ``input_rows`` positionally, the rest by keyword), and their docstrings repeat this list.

    Attributes:
        input_size: F. Vector mode: features per step (the input is ``[B, ...]``, flattened to
            ``[B, F]``). Matrix mode: features per input row (``[B, n, ...]`` → ``[B, n, F]``).
        mem_slots: N, the number of memory slots.
        head_size: D, the value size per attention head.
        num_heads: H. The slot width is M = H·D. Default 1.
        num_blocks: attention + MLP blocks per step. Default 1.
        forget_bias: constant added to the forget gate's pre-activation (±inf allowed).
            Default 1.0.
        input_bias: constant added to the input gate's pre-activation (±inf allowed).
            Default 0.0.
        gate_style: 'unit' (a gate per element, g = M), 'memory' (a scalar per slot, g = 1) or
            None (no gating: the new memory is the attention output). Default 'unit'.
        attention_mlp_layers: L, depth of the row-wise MLP. Default 2.
        key_size: K, query and key size per head; None or 0 means K = D. Default None.
        input_rows: None for vector mode, or n >= 1 for matrix mode with n input rows per step.
        query_rows: 'all' (Sonnet, default) or 'memory' (paper eq. 2: only memory rows query).
        output_gate: the paper's LSTM form (eqs. 3–9): the state becomes ``(memory, hidden)``
            and the output is ``flatten(σ(o) ∘ tanh(m_t))`` (``docs/rmc.md`` §9.2). Default False.
        output_bias: constant added to the output gate's pre-activation. Default 0.0.
        share_attention_mlp: one MLP for all blocks (Sonnet, default) or one per block.
        trainable_gate_biases: make the gate bias constants learnable scalars. Default False.
    """

    input_size: int
    mem_slots: int
    head_size: int
    num_heads: int = 1
    num_blocks: int = 1
    forget_bias: float = 1.0
    input_bias: float = 0.0
    gate_style: GateStyle = "unit"
    attention_mlp_layers: int = 2
    key_size: int | None = None
    input_rows: int | None = None
    query_rows: QueryRows = "all"
    output_gate: bool = False
    output_bias: float = 0.0
    share_attention_mlp: bool = True
    trainable_gate_biases: bool = False

    def __post_init__(self) -> None:
        positive = {
            "input_size": self.input_size,
            "mem_slots": self.mem_slots,
            "head_size": self.head_size,
            "num_heads": self.num_heads,
            "num_blocks": self.num_blocks,
            "attention_mlp_layers": self.attention_mlp_layers,
        }
        for name, value in positive.items():  # stored as Python ints (NumPy's are accepted)
            object.__setattr__(self, name, check_int(name, value, owner="RMCConfig"))
        optional = {  # name: (least integer, what the field accepts)
            "key_size": (0, "None or an integer >= 0 (0/None mean key_size = head_size)"),
            "input_rows": (
                1,
                "None (vector input) or an integer >= 1 (matrix input with that many rows)",
            ),
        }
        for name, (minimum, accepted) in optional.items():
            value = getattr(self, name)
            if value is None:
                continue
            number = as_int(value)
            if number is None or number < minimum:
                raise ValueError(f"RMCConfig: {name} must be {accepted}, got {value!r}")
            object.__setattr__(self, name, number)
        if self.gate_style not in ("unit", "memory", None):
            raise ValueError(
                f"RMCConfig: gate_style must be 'unit', 'memory' or None, got {self.gate_style!r}"
            )
        if self.query_rows not in ("all", "memory"):
            raise ValueError(
                f"RMCConfig: query_rows must be 'all' or 'memory', got {self.query_rows!r}"
            )
        if self.output_gate and self.gate_style is None:
            raise ValueError(
                "RMCConfig: output_gate=True needs gating; set gate_style to 'unit' or 'memory'"
            )
        if self.trainable_gate_biases and self.gate_style is None:
            # Without gates the bias scalars would be dead parameters (no gradient, DDP errors).
            raise ValueError(
                "RMCConfig: trainable_gate_biases=True needs gating; set gate_style to 'unit' "
                "or 'memory'"
            )
        for name in ("output_gate", "share_attention_mlp", "trainable_gate_biases"):
            check_bool(name, getattr(self, name), owner="RMCConfig")
        for name in ("forget_bias", "input_bias", "output_bias"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
                raise ValueError(f"RMCConfig: {name} must be a float (±inf allowed), got {value!r}")
            object.__setattr__(self, name, float(value))

    @property
    def mem_size(self) -> int:
        """M = H·D, the features per memory slot."""
        return self.num_heads * self.head_size

    @property
    def resolved_key_size(self) -> int:
        """K, with Sonnet's rule that None or 0 means K = D."""
        return self.key_size or self.head_size

    @property
    def qkv_size(self) -> int:
        """Q = H·(2K + D), the width of the joint qkv projection."""
        return self.num_heads * (2 * self.resolved_key_size + self.head_size)

    @property
    def num_input_rows(self) -> int:
        """n: 1 in vector mode, ``input_rows`` in matrix mode."""
        return self.input_rows or 1

    @property
    def gate_size(self) -> int:
        """g: M for 'unit', 1 for 'memory', 0 without gating."""
        return {"unit": self.mem_size, "memory": 1, None: 0}[self.gate_style]

    @property
    def num_gates(self) -> int:
        """Gate groups: [input, forget] or [input, forget, output]."""
        return 3 if self.output_gate else 2

    @property
    def gate_bias_constants(self) -> list[float]:
        """The constant gate biases, one per gate group: [input, forget(, output)]."""
        return [self.input_bias, self.forget_bias, self.output_bias][: self.num_gates]

    @property
    def output_size(self) -> int:
        """N·M, the flattened memory returned at every step."""
        return self.mem_slots * self.mem_size

    @property
    def step_elements(self) -> int:
        """H·N·(N + n), the numbers of one example's largest per-step intermediate, an
        attention's scores (a size check bounds it before anything is built: many slots of a
        small width have few parameters and a small memory, and scores too large to hold)."""
        return self.num_heads * self.mem_slots * (self.mem_slots + self.num_input_rows)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def config_arguments_doc() -> str:
    """The ``Attributes:`` entries of :class:`RMCConfig`'s docstring, as written there.

    The modules paste them into their own ``Args:`` sections, so each argument is described
    once.
    """
    lines = (RMCConfig.__doc__ or "").splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "Attributes:") + 1
    entries = []
    for line in lines[start:]:
        if not line.strip():
            break
        entries.append(line)
    return "\n".join(entries)
