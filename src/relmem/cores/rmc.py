"""Relational Memory Core (Santoro et al. 2018): the reference implementation.

This file follows ``specs/rmc.md`` section 4 line by line and is the oracle for every fast path.
Defaults reproduce Sonnet v1's ``RelationalMemory``; the paper/patent variants of spec
section 9 are options of :class:`RMCConfig`.

Notation (spec section 1): B batch, T time, N ``mem_slots``, H ``num_heads``, D ``head_size``,
K ``key_size``, M = H·D the slot width, Q = H·(2K + D) the qkv width, n input rows per step,
F input features (per row in matrix mode), g the gate width (M for 'unit', 1 for 'memory').
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from relmem.cores.base import (
    SequenceInput,
    check_state_tensor,
    finish_sequence,
    prepare_sequence,
    run_cell_loop,
)

GateStyle = Literal["unit", "memory"] | None
Implementation = Literal["auto", "reference", "fast"]


def _check_implementation(name: str, implementation: str) -> str:
    if implementation not in ("auto", "reference", "fast"):
        raise ValueError(
            f"{name}: implementation must be 'auto', 'reference' or 'fast', "
            f"got {implementation!r}"
        )
    return implementation


class RMCState(NamedTuple):
    """The recurrent state of a Relational Memory Core.

    Attributes:
        memory: ``[B, N, M]`` the memory matrix ``m_t``.
        hidden: ``[B, N, M]`` the output-gated ``h_t`` (spec 9.2), present only when
            ``output_gate=True``; otherwise None.
    """

    memory: Tensor
    hidden: Tensor | None = None


class RMCStepDetails(NamedTuple):
    """Introspection for one step, returned with ``return_details=True`` (spec 4.9).

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
    """Every hyper-parameter of a Relational Memory Core (spec sections 2 and 9).

    Attributes:
        input_size: F, features per step (vector mode) or per input row (matrix mode).
        mem_slots: N, the number of memory rows.
        head_size: D, the value size per head.
        num_heads: H; the slot width is M = H·D.
        num_blocks: attention + MLP blocks per time step.
        forget_bias: constant added to the forget-gate pre-activation (±inf allowed).
        input_bias: constant added to the input-gate pre-activation (±inf allowed).
        gate_style: 'unit' (per element), 'memory' (one scalar per slot) or None (no gating).
        attention_mlp_layers: L, depth of the row-wise MLP.
        key_size: K, the query/key size per head; None or 0 means K = D.
        input_rows: None for vector mode, or n >= 1 for matrix mode with exactly n rows.
        query_rows: 'all' (Sonnet) or 'memory' (paper eq. 2: queries from memory rows only).
        output_gate: the paper's LSTM form with an output gate and state (m, h) (spec 9.2).
        output_bias: constant added to the output-gate pre-activation.
        share_attention_mlp: one MLP shared by all blocks (Sonnet) or one per block.
        trainable_gate_biases: make input/forget/output biases learnable scalars.
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
    query_rows: Literal["all", "memory"] = "all"
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
        for name, value in positive.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"RMCConfig: {name} must be an integer >= 1, got {value!r}")
        if self.key_size is not None and (
            isinstance(self.key_size, bool)
            or not isinstance(self.key_size, int)
            or self.key_size < 0
        ):
            raise ValueError(
                f"RMCConfig: key_size must be None or an integer >= 0 (0/None mean key_size = "
                f"head_size), got {self.key_size!r}"
            )
        if self.input_rows is not None and (
            isinstance(self.input_rows, bool)
            or not isinstance(self.input_rows, int)
            or self.input_rows < 1
        ):
            raise ValueError(
                f"RMCConfig: input_rows must be None (vector input) or an integer >= 1 "
                f"(matrix input with that many rows), got {self.input_rows!r}"
            )
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
    def output_size(self) -> int:
        """N·M, the flattened memory returned at every step."""
        return self.mem_slots * self.mem_size

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _truncated_normal_(weight: Tensor, fan_in: int) -> None:
    """Sonnet's initialiser: N(0, 1/fan_in) re-drawn outside ±2σ (spec section 7)."""
    std = 1.0 / math.sqrt(fan_in)
    nn.init.trunc_normal_(weight, mean=0.0, std=std, a=-2 * std, b=2 * std)


def layer_norm_fp32(x: Tensor, norm: nn.LayerNorm) -> Tensor:
    """Row-wise LayerNorm over the last axis, computed in fp32 for fp16/bf16 inputs (spec 4.8)."""
    if x.dtype in (torch.float16, torch.bfloat16):
        weight = None if norm.weight is None else norm.weight.float()
        bias = None if norm.bias is None else norm.bias.float()
        out = F.layer_norm(x.float(), norm.normalized_shape, weight, bias, norm.eps)
        return out.to(x.dtype)
    return norm(x)


class AttentionMLP(nn.Module):
    """The row-wise MLP: L linear layers M→M with ReLU between them, none after the last."""

    def __init__(self, size: int, num_layers: int, **factory: Any) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(size, size, **factory) for _ in range(num_layers))

    def forward(self, x: Tensor) -> Tensor:
        """``[..., M] -> [..., M]``."""
        for index, layer in enumerate(self.layers):
            if index > 0:
                x = F.relu(x)
            x = layer(x)
        return x


class AttentionBlock(nn.Module):
    """One block of spec 4.3, without the MLP (which may be shared and is passed in).

    Parameters: ``qkv`` (M→Q, head-major columns ``[q_0 k_0 v_0 | q_1 k_1 v_1 | …]``),
    ``qkv_norm`` (LN over all Q features), ``attention_norm`` and ``mlp_norm`` (LN over M).
    """

    def __init__(self, config: RMCConfig, **factory: Any) -> None:
        super().__init__()
        m, q = config.mem_size, config.qkv_size
        self.num_heads = config.num_heads
        self.key_size = config.resolved_key_size
        self.head_size = config.head_size
        self.qkv = nn.Linear(m, q, **factory)
        self.qkv_norm = nn.LayerNorm(q, eps=1e-5, **factory)
        self.attention_norm = nn.LayerNorm(m, eps=1e-5, **factory)
        self.mlp_norm = nn.LayerNorm(m, eps=1e-5, **factory)

    def forward(
        self, rows: Tensor, num_queries: int, mlp: AttentionMLP
    ) -> tuple[Tensor, Tensor]:
        """Attend over ``rows`` and update the first ``num_queries`` of them.

        Args:
            rows: ``[B, R, M]`` memory rows followed by input rows.
            num_queries: R_q; only rows ``0..R_q-1`` issue queries and are updated.
            mlp: the row-wise MLP this block applies.

        Returns:
            ``(updated [B, R_q, M], attention weights [B, H, R_q, R])``.
        """
        batch, num_rows, _ = rows.shape
        h, k, d = self.num_heads, self.key_size, self.head_size
        z = layer_norm_fp32(self.qkv(rows), self.qkv_norm)  # [B, R, Q]
        z = z.view(batch, num_rows, h, 2 * k + d).transpose(1, 2)  # [B, H, R, 2K+D]
        query, key, value = z.split([k, k, d], dim=-1)  # [B,H,R,K], [B,H,R,K], [B,H,R,D]
        query = query[:, :, :num_queries] * k**-0.5  # [B, H, R_q, K], scaled out of place
        scores = query @ key.transpose(-1, -2)  # [B, H, R_q, R]
        weights = torch.softmax(scores, dim=-1)  # over keys
        attended = weights @ value  # [B, H, R_q, D]
        attended = attended.transpose(1, 2).reshape(batch, num_queries, h * d)  # [B, R_q, M]
        updated = layer_norm_fp32(rows[:, :num_queries] + attended, self.attention_norm)
        updated = layer_norm_fp32(mlp(updated) + updated, self.mlp_norm)  # [B, R_q, M]
        return updated, weights


class RelationalMemoryCell(nn.Module):
    """One time step of the Relational Memory Core (``specs/rmc.md`` section 4).

    The memory is a matrix of N slots of width M = H·D. At each step the input is projected to
    M features, appended to the memory as extra rows, and ``num_blocks`` times the rows attend
    to each other with multi-head dot-product attention (joint LayerNorm over q, k and v; scale
    K^-1/2; no output projection), then pass a residual LayerNorm, a shared row-wise MLP and a
    second residual LayerNorm. The updated memory rows are blended with the old memory through
    LSTM-style input and forget gates.

    Args:
        input_size: F. Vector mode: features per step (the input is ``[B, ...]``, flattened to
            ``[B, F]``). Matrix mode: features per input row (``[B, n, ...]`` → ``[B, n, F]``).
        mem_slots: N, the number of memory slots.
        head_size: D, the value size per attention head.
        num_heads: H. The slot width is M = H·D. Default 1.
        num_blocks: attention + MLP blocks per step. Default 1.
        forget_bias: constant added to the forget gate's pre-activation. Default 1.0.
        input_bias: constant added to the input gate's pre-activation. Default 0.0.
        gate_style: 'unit' (a gate per element, g = M), 'memory' (a scalar per slot, g = 1) or
            None (no gating: the new memory is the attention output). Default 'unit'.
        attention_mlp_layers: L, depth of the row-wise MLP. Default 2.
        key_size: K, query and key size per head; None or 0 means K = D. Default None.
        input_rows: None for vector mode, or n for matrix mode with n input rows per step.
        query_rows: 'all' (Sonnet, default) or 'memory' (paper eq. 2: only memory rows query).
        output_gate: the paper's LSTM form (eqs. 3–9): the state becomes ``(memory, hidden)``
            and the output is ``flatten(σ(o) ∘ tanh(m_t))``. Default False.
        output_bias: constant added to the output gate's pre-activation. Default 0.0.
        share_attention_mlp: one MLP for all blocks (Sonnet, default) or one per block.
        trainable_gate_biases: make the gate bias constants learnable scalars. Default False.
        implementation: 'reference' (the plain step of spec section 4), 'fast' (the same
            function with the exact rewrites of spec section 10 that apply to one step: E4,
            E5, E6, E7; see :mod:`relmem.cores.rmc_fast`) or 'auto' (default: 'fast', except
            for ``return_details=True``, which needs every row's attention weights and always
            runs the reference).
        device, dtype: factory arguments for every parameter.

    Shapes:
        - input: ``[B, F]`` (vector mode; trailing dims are flattened) or ``[B, n, F]``.
        - state: :class:`RMCState` with ``memory [B, N, M]`` (and ``hidden [B, N, M]`` with
          ``output_gate=True``); None means :meth:`initial_state`.
        - output: ``[B, N·M]``, the new memory (or hidden) flattened row-major.
    """

    def __init__(
        self,
        input_size: int,
        mem_slots: int,
        head_size: int,
        num_heads: int = 1,
        num_blocks: int = 1,
        forget_bias: float = 1.0,
        input_bias: float = 0.0,
        gate_style: GateStyle = "unit",
        attention_mlp_layers: int = 2,
        key_size: int | None = None,
        input_rows: int | None = None,
        *,
        query_rows: Literal["all", "memory"] = "all",
        output_gate: bool = False,
        output_bias: float = 0.0,
        share_attention_mlp: bool = True,
        trainable_gate_biases: bool = False,
        implementation: Implementation = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        config = RMCConfig(
            input_size=input_size,
            mem_slots=mem_slots,
            head_size=head_size,
            num_heads=num_heads,
            num_blocks=num_blocks,
            forget_bias=forget_bias,
            input_bias=input_bias,
            gate_style=gate_style,
            attention_mlp_layers=attention_mlp_layers,
            key_size=key_size,
            input_rows=input_rows,
            query_rows=query_rows,
            output_gate=output_gate,
            output_bias=output_bias,
            share_attention_mlp=share_attention_mlp,
            trainable_gate_biases=trainable_gate_biases,
        )
        self.config = config
        self.implementation = _check_implementation(type(self).__name__, implementation)
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        m, n = config.mem_size, config.num_input_rows
        self.input_projection = nn.Linear(input_size, m, **factory)
        self.blocks = nn.ModuleList(AttentionBlock(config, **factory) for _ in range(num_blocks))
        num_mlps = 1 if share_attention_mlp else num_blocks
        self.mlps = nn.ModuleList(
            AttentionMLP(m, attention_mlp_layers, **factory) for _ in range(num_mlps)
        )
        self.input_gate: nn.Linear | None = None
        self.memory_gate: nn.Linear | None = None
        if gate_style is not None:
            width = config.num_gates * config.gate_size
            self.input_gate = nn.Linear(n * m, width, **factory)
            self.memory_gate = nn.Linear(m, width, **factory)
        self.gate_biases: nn.Parameter | None = None
        if trainable_gate_biases:
            self.gate_biases = nn.Parameter(torch.empty(config.num_gates, **factory))
        self.reset_parameters()

    # ------------------------------------------------------------------ parameters

    def reset_parameters(self) -> None:
        """Sonnet's initialisation (spec 7): truncated normal weights, zero biases, LN γ=1, β=0."""
        linears = [self.input_projection, *(b.qkv for b in self.blocks)]
        linears += [layer for mlp in self.mlps for layer in mlp.layers]
        linears += [g for g in (self.input_gate, self.memory_gate) if g is not None]
        for linear in linears:
            _truncated_normal_(linear.weight, linear.in_features)
            nn.init.zeros_(linear.bias)
        for block in self.blocks:
            for norm in (block.qkv_norm, block.attention_norm, block.mlp_norm):
                norm.reset_parameters()
        if self.gate_biases is not None:
            with torch.no_grad():
                biases = self.gate_biases
                # Build the constants in the parameter's dtype: torch.tensor(list of floats)
                # would round them to float32 first, even for a float64 module.
                biases.copy_(
                    torch.tensor(
                        self._constant_gate_biases(), dtype=biases.dtype, device=biases.device
                    )
                )

    def _constant_gate_biases(self) -> list[float]:
        cfg = self.config
        return [cfg.input_bias, cfg.forget_bias, cfg.output_bias][: cfg.num_gates]

    def mlp_for_block(self, index: int) -> AttentionMLP:
        """The MLP used by block ``index`` (the shared one unless ``share_attention_mlp=False``)."""
        return self.mlps[0 if self.config.share_attention_mlp else index]

    @property
    def state_size(self) -> torch.Size:
        """``[N, M]``, the per-example memory shape."""
        return torch.Size([self.config.mem_slots, self.config.mem_size])

    @property
    def output_size(self) -> int:
        """N·M."""
        return self.config.output_size

    def extra_repr(self) -> str:
        cfg = self.config
        return (
            f"input_size={cfg.input_size}, mem_slots={cfg.mem_slots}, head_size={cfg.head_size}, "
            f"num_heads={cfg.num_heads}, num_blocks={cfg.num_blocks}, gate_style={cfg.gate_style!r}"
            f", key_size={cfg.resolved_key_size}, input_rows={cfg.input_rows}"
        )

    # ------------------------------------------------------------------ state

    def _factory_defaults(self) -> tuple[torch.device, torch.dtype]:
        weight = self.input_projection.weight
        return weight.device, weight.dtype

    def initial_state(
        self,
        batch_size: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> RMCState:
        """The identity initial memory of spec section 3.

        ``m0[b, i, j] = 1 if i == j else 0`` for i < N, j < M: the N×N identity padded with zero
        columns when M > N, or cut to M columns when M < N. With ``output_gate=True`` the hidden
        state starts as ``tanh(m0)``.

        Args:
            batch_size: B.
            device, dtype: default to the module's parameters'.

        Returns:
            :class:`RMCState` with ``memory [B, N, M]`` (constant, no gradient).
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(
                f"initial_state: batch_size must be an integer >= 1, got {batch_size!r}"
            )
        default_device, default_dtype = self._factory_defaults()
        device = default_device if device is None else torch.device(device)
        dtype = default_dtype if dtype is None else dtype
        n, m = self.config.mem_slots, self.config.mem_size
        memory = torch.eye(n, m, device=device, dtype=dtype).expand(batch_size, n, m).clone()
        hidden = torch.tanh(memory) if self.config.output_gate else None
        return RMCState(memory, hidden)

    def check_state(self, state: Any, batch_size: int) -> RMCState:
        """Validate a user-given state and return it as an :class:`RMCState`."""
        name = type(self).__name__
        if isinstance(state, Tensor):
            state = RMCState(state)
        if not isinstance(state, tuple) or len(state) not in (1, 2):
            raise TypeError(
                f"{name}: state must be an RMCState (or a memory tensor [B, N, M]), "
                f"got {type(state).__name__}"
            )
        state = RMCState(*state)
        device, dtype = self._factory_defaults()
        shape = (batch_size, *self.state_size)
        check_state_tensor(name, "memory", state.memory, shape, dtype, device)
        if self.config.output_gate:
            if state.hidden is None:
                raise ValueError(
                    f"{name}: output_gate=True needs state.hidden [B, N, M]; start from "
                    "initial_state(batch_size) to get one"
                )
            check_state_tensor(name, "hidden", state.hidden, shape, dtype, device)
        elif state.hidden is not None:
            raise ValueError(
                f"{name}: state.hidden must be None unless output_gate=True; got a tensor"
            )
        return state

    # ------------------------------------------------------------------ input

    def check_step_input(self, input: Tensor, *, caller: str | None = None) -> Tensor:
        """Validate one step's input; return it as ``[B, n, F]`` (n = 1 in vector mode).

        Args:
            input: ``[B, F]`` / ``[B, n, F]``, trailing dims flattened.
            caller: the name used in error messages (default: this class's).
        """
        name = caller or type(self).__name__
        cfg = self.config
        if not isinstance(input, Tensor):
            raise TypeError(f"{name}: input must be a torch.Tensor, got {type(input).__name__}")
        if cfg.input_rows is None:
            if input.dim() < 2:
                raise ValueError(
                    f"{name}: vector mode expects input [B, F] with F={cfg.input_size} (trailing "
                    f"dims are flattened), got shape {tuple(input.shape)}"
                )
            rows = input.reshape(input.shape[0], 1, -1)
            got = f"{math.prod(input.shape[1:])} features (shape {tuple(input.shape)})"
        else:
            if input.dim() < 3 or input.shape[1] != cfg.input_rows:
                raise ValueError(
                    f"{name}: matrix mode expects input [B, n={cfg.input_rows}, F={cfg.input_size}]"
                    f" (dims after n are flattened), got shape {tuple(input.shape)}"
                )
            rows = input.reshape(input.shape[0], input.shape[1], -1)
            got = f"{rows.shape[-1]} features per row (shape {tuple(input.shape)})"
        if rows.shape[-1] != cfg.input_size:
            raise ValueError(f"{name}: expected input_size={cfg.input_size}, got {got}")
        device, dtype = self._factory_defaults()
        if not input.is_floating_point():
            raise TypeError(
                f"{name}: input must be a floating-point tensor, got {input.dtype}; "
                "convert integer tokens with an embedding or one-hot first"
            )
        if input.dtype != dtype and not torch.is_autocast_enabled(device.type):
            raise TypeError(
                f"{name}: input dtype {input.dtype} differs from the parameters' {dtype}; "
                f"convert the input with .to({dtype}) or the module with .to(dtype)"
            )
        if input.device != device:
            raise ValueError(
                f"{name}: input is on {input.device} but the module is on {device}; move one of "
                "them with .to(device)"
            )
        return rows

    # ------------------------------------------------------------------ the step

    def step(
        self, rows: Tensor, state: RMCState
    ) -> tuple[Tensor, RMCState, RMCStepDetails]:
        """The reference step on validated inputs (spec 4.1–4.7).

        Args:
            rows: ``[B, n, F]`` the step input, already validated.
            state: validated :class:`RMCState`.

        Returns:
            ``(output [B, N·M], new state, details)``.
        """
        cfg = self.config
        memory = state.memory  # [B, N, M]
        num_slots = cfg.mem_slots
        x = self.input_projection(rows)  # 4.1: [B, n, M]

        # 4.2–4.4: attention blocks over [memory; input] rows, then drop the input rows.
        attention = []
        if cfg.query_rows == "all":
            h = torch.cat([memory, x], dim=1)  # [B, N+n, M]
            for index, block in enumerate(self.blocks):
                h, weights = block(h, h.shape[1], self.mlp_for_block(index))
                attention.append(weights)
            new_rows = h[:, :num_slots]  # [B, N, M]
        else:  # spec 9.1: input rows stay x in every block; only memory rows query
            new_rows = memory
            for index, block in enumerate(self.blocks):
                h = torch.cat([new_rows, x], dim=1)  # [B, N+n, M]
                new_rows, weights = block(h, num_slots, self.mlp_for_block(index))
                attention.append(weights)

        if cfg.gate_style is None:  # 4.6
            new_memory = new_rows
            output = new_memory.flatten(1)
            return output, RMCState(new_memory), RMCStepDetails(None, None, None, tuple(attention))

        # 4.5: gates from the flattened projected input and tanh(previous memory) (or h_{t-1}).
        assert self.input_gate is not None and self.memory_gate is not None
        recurrent = state.hidden if cfg.output_gate else torch.tanh(memory)
        gates = self.memory_gate(recurrent) + self.input_gate(x.flatten(1)).unsqueeze(1)
        g = cfg.gate_size
        biases = self.gate_biases if self.gate_biases is not None else self._constant_gate_biases()
        input_gate = torch.sigmoid(gates[..., :g] + biases[0])  # [B, N, g]
        forget_gate = torch.sigmoid(gates[..., g : 2 * g] + biases[1])  # [B, N, g]
        new_memory = input_gate * torch.tanh(new_rows) + forget_gate * memory  # [B, N, M]
        if not cfg.output_gate:
            details = RMCStepDetails(input_gate, forget_gate, None, tuple(attention))
            return new_memory.flatten(1), RMCState(new_memory), details
        output_gate = torch.sigmoid(gates[..., 2 * g :] + biases[2])  # [B, N, g]
        hidden = output_gate * torch.tanh(new_memory)  # [B, N, M]
        details = RMCStepDetails(input_gate, forget_gate, output_gate, tuple(attention))
        return hidden.flatten(1), RMCState(new_memory, hidden), details

    def forward(
        self,
        input: Tensor,
        state: RMCState | Tensor | None = None,
        *,
        return_details: bool = False,
    ) -> tuple[Tensor, RMCState] | tuple[Tensor, RMCState, RMCStepDetails]:
        """Run one time step.

        Args:
            input: ``[B, F]`` (vector mode) or ``[B, n, F]`` (matrix mode).
            state: :class:`RMCState` (or a ``[B, N, M]`` memory tensor); None starts from
                :meth:`initial_state` on the input's device and dtype.
            return_details: also return :class:`RMCStepDetails` (gates and attention weights).

        Returns:
            ``(output [B, N·M], new_state)``, plus the details when requested.
        """
        rows = self.check_step_input(input)
        if state is None:
            state = self.initial_state(rows.shape[0])
        else:
            state = self.check_state(state, rows.shape[0])
        if return_details or self.implementation == "reference":
            output, new_state, details = self.step(rows, state)
            return (output, new_state, details) if return_details else (output, new_state)
        from relmem.cores.rmc_fast import fast_cell_step

        return fast_cell_step(self, rows, state)


class RelationalMemory(nn.Module):
    """A Relational Memory Core over a whole sequence, shaped like ``nn.LSTM``.

    It runs :class:`RelationalMemoryCell` (available as ``.cell``) at every time step. Every
    constructor argument except ``batch_first`` is the cell's; see
    :class:`RelationalMemoryCell` for their meaning.

    Args:
        input_size: F, features per step (vector mode) or per input row (matrix mode).
        mem_slots: N. head_size: D. num_heads: H (M = H·D). num_blocks: blocks per step.
        forget_bias, input_bias: gate bias constants (defaults 1.0 and 0.0).
        gate_style: 'unit', 'memory' or None. attention_mlp_layers: L (default 2).
        key_size: K (None or 0: K = D). input_rows: None (vector) or n (matrix mode).
        batch_first: input and output are ``[B, T, ...]`` instead of ``[T, B, ...]``
            (default False, as ``nn.LSTM``). The state is batch-leading either way.
        query_rows, output_gate, output_bias, share_attention_mlp, trainable_gate_biases:
            the variants of spec section 9, off by default.
        implementation: 'reference' (the plain time loop over ``cell.step``, the test oracle),
            'fast' (:func:`relmem.cores.rmc_fast.fast_sequence`: input-only work hoisted out of
            the loop and the step rewritten with the exact equivalences of spec section 10;
            every option is supported) or 'auto' (default; currently always 'fast', which
            matches the reference to float rounding). bf16, ``torch.compile`` and CUDA graphs
            are opt-in through :class:`relmem.cores.rmc_fast.FastRelationalMemory`.
        device, dtype: factory arguments for every parameter.

    Shapes:
        - input: ``[T, B, F]`` (vector mode) or ``[T, B, n, F]`` (matrix mode), time and batch
          swapped with ``batch_first=True``; or a ``PackedSequence``.
        - state: :class:`RMCState` with ``memory [B, N, M]``; None means the identity state.
        - lengths: optional ``[B]`` integers in ``0..T``. After step ``lengths[b] - 1`` example
          b's state is frozen and its outputs are zero.
        - output: ``[T, B, N·M]`` (``[B, T, N·M]`` with ``batch_first``), or a
          ``PackedSequence`` when the input was one.
        - returned state: the state after each example's last valid step.
    """

    def __init__(
        self,
        input_size: int,
        mem_slots: int,
        head_size: int,
        num_heads: int = 1,
        num_blocks: int = 1,
        forget_bias: float = 1.0,
        input_bias: float = 0.0,
        gate_style: GateStyle = "unit",
        attention_mlp_layers: int = 2,
        key_size: int | None = None,
        input_rows: int | None = None,
        batch_first: bool = False,
        *,
        query_rows: Literal["all", "memory"] = "all",
        output_gate: bool = False,
        output_bias: float = 0.0,
        share_attention_mlp: bool = True,
        trainable_gate_biases: bool = False,
        implementation: Implementation = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.implementation = _check_implementation(type(self).__name__, implementation)
        self.cell = RelationalMemoryCell(
            input_size,
            mem_slots,
            head_size,
            num_heads,
            num_blocks,
            forget_bias,
            input_bias,
            gate_style,
            attention_mlp_layers,
            key_size,
            input_rows,
            query_rows=query_rows,
            output_gate=output_gate,
            output_bias=output_bias,
            share_attention_mlp=share_attention_mlp,
            trainable_gate_biases=trainable_gate_biases,
            implementation=implementation,
            device=device,
            dtype=dtype,
        )

    @property
    def config(self) -> RMCConfig:
        return self.cell.config

    @property
    def state_size(self) -> torch.Size:
        return self.cell.state_size

    @property
    def output_size(self) -> int:
        return self.cell.output_size

    def reset_parameters(self) -> None:
        """Re-draw every parameter with Sonnet's initialisation."""
        self.cell.reset_parameters()

    def initial_state(
        self,
        batch_size: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> RMCState:
        """See :meth:`RelationalMemoryCell.initial_state`."""
        return self.cell.initial_state(batch_size, device=device, dtype=dtype)

    def extra_repr(self) -> str:
        return f"batch_first={self.batch_first}, implementation={self.implementation!r}"

    def prepare(
        self,
        input: Tensor | PackedSequence,
        state: RMCState | Tensor | None,
        lengths: Tensor | Sequence[int] | None,
    ) -> tuple[SequenceInput, Tensor, RMCState]:
        """Validate a sequence call's arguments.

        Returns:
            ``(sequence, rows [T, B, n, F], state)`` with the state validated or initial.
        """
        cell = self.cell
        min_rank = 3 if cell.config.input_rows is None else 4
        seq = prepare_sequence(input, lengths, self.batch_first, min_rank, type(self).__name__)
        steps, batch = seq.inputs.shape[:2]
        caller = f"{type(self).__name__} (each time step of the input)"
        first = cell.check_step_input(seq.inputs[0], caller=caller)  # [B, n, F]
        rows = seq.inputs.reshape(steps, batch, *first.shape[1:])  # [T, B, n, F]
        state = cell.initial_state(batch) if state is None else cell.check_state(state, batch)
        return seq, rows, state

    def forward(
        self,
        input: Tensor | PackedSequence,
        state: RMCState | Tensor | None = None,
        *,
        lengths: Tensor | Sequence[int] | None = None,
    ) -> tuple[Tensor | PackedSequence, RMCState]:
        """Run the core over a sequence.

        Args:
            input: ``[T, B, F]`` / ``[T, B, n, F]`` (batch-first if configured), or a
                ``PackedSequence``.
            state: initial :class:`RMCState`; None means :meth:`initial_state`.
            lengths: optional ``[B]`` valid lengths in ``0..T``.

        Returns:
            ``(output [T, B, N·M], final_state)`` in the input's layout.
        """
        cell = self.cell
        seq, rows, state = self.prepare(input, state, lengths)
        if self.implementation != "reference":
            from relmem.cores.rmc_fast import fast_sequence

            outputs, final_state = fast_sequence(cell, rows, state, seq.lengths)
            return finish_sequence(outputs, seq, self.batch_first), final_state

        def step(rows_t: Tensor, state_t: RMCState) -> tuple[Tensor, RMCState]:
            output, new_state, _ = cell.step(rows_t, state_t)
            return output, new_state

        outputs, final_state = run_cell_loop(step, rows, state, seq.lengths)
        return finish_sequence(outputs, seq, self.batch_first), final_state
