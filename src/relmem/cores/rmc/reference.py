"""The reference Relational Memory Core step: ``docs/rmc.md`` §4, line by line.

This is the oracle for every fast path. It holds the submodules that own a block's parameters
(:class:`AttentionMLP`, :class:`AttentionBlock`) and :func:`reference_step`, the plain step
over a cell's submodules. Defaults reproduce Sonnet v1's ``RelationalMemory``; the
paper/patent variants of ``docs/rmc.md`` §9 are options of :class:`RMCConfig`.

Notation (``docs/rmc.md`` §1): B batch, N ``mem_slots``, H ``num_heads``, D ``head_size``,
K ``key_size``, M = H·D, Q = H·(2K + D), n input rows per step, F input features, g the gate
width.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from relmem.cores.rmc.config import RMCConfig, RMCState, RMCStepDetails


def layer_norm_fp32(x: Tensor, norm: nn.LayerNorm) -> Tensor:
    """Row-wise LayerNorm over the last axis, computed in fp32 for fp16/bf16 inputs
    (``docs/rmc.md`` §4.8)."""
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
    """One block of ``docs/rmc.md`` §4.3, without the MLP (which may be shared and is passed in).

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

    def forward(self, rows: Tensor, num_queries: int, mlp: AttentionMLP) -> tuple[Tensor, Tensor]:
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


class CellModules(Protocol):
    """The submodules of a cell that the reference step reads (``RelationalMemoryCell``)."""

    config: RMCConfig
    input_projection: nn.Linear  # F → M
    blocks: nn.ModuleList  # num_blocks × AttentionBlock
    input_gate: nn.Linear | None  # n·M → W, None without gating
    memory_gate: nn.Linear | None  # M → W, None without gating
    gate_biases: nn.Parameter | None  # [num_gates] with trainable_gate_biases, else None

    def mlp_for_block(self, index: int) -> AttentionMLP: ...


def reference_step(
    cell: CellModules, rows: Tensor, state: RMCState
) -> tuple[Tensor, RMCState, RMCStepDetails]:
    """The reference step on validated inputs (``docs/rmc.md`` §4.1–§4.7).

    Args:
        cell: the submodules holding the parameters.
        rows: ``[B, n, F]`` the step input, already validated.
        state: validated :class:`RMCState`.

    Returns:
        ``(output [B, N·M], new state, details)``.
    """
    cfg = cell.config
    memory = state.memory  # [B, N, M]
    num_slots = cfg.mem_slots
    x = cell.input_projection(rows)  # 4.1: [B, n, M]

    # 4.2–4.4: attention blocks over [memory; input] rows, then drop the input rows.
    attention = []
    if cfg.query_rows == "all":
        h = torch.cat([memory, x], dim=1)  # [B, N+n, M]
        for index, block in enumerate(cell.blocks):
            h, weights = block(h, h.shape[1], cell.mlp_for_block(index))
            attention.append(weights)
        new_rows = h[:, :num_slots]  # [B, N, M]
    else:  # `docs/rmc.md` §9.1: input rows stay x in every block; only memory rows query
        new_rows = memory
        for index, block in enumerate(cell.blocks):
            h = torch.cat([new_rows, x], dim=1)  # [B, N+n, M]
            new_rows, weights = block(h, num_slots, cell.mlp_for_block(index))
            attention.append(weights)

    if cfg.gate_style is None:  # 4.6
        new_memory = new_rows
        output = new_memory.flatten(1)
        return output, RMCState(new_memory), RMCStepDetails(None, None, None, tuple(attention))

    # 4.5: gates from the flattened projected input and tanh(previous memory) (or h_{t-1}).
    assert cell.input_gate is not None and cell.memory_gate is not None
    recurrent = state.hidden if cfg.output_gate else torch.tanh(memory)
    gates = cell.memory_gate(recurrent) + cell.input_gate(x.flatten(1)).unsqueeze(1)
    g = cfg.gate_size
    biases = cell.gate_biases if cell.gate_biases is not None else cfg.gate_bias_constants
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
