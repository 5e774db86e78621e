"""The fast Relational Memory Core path: the reference's function, computed with fewer ops.

Every transformation here is one of the exact equivalences of ``docs/rmc.md`` §10; the
reference (:func:`relmem.cores.rmc.reference.reference_step` inside
:func:`relmem.cores.base.run_cell_loop`) is the test oracle (``tests/cores/test_rmc_fast.py``).
The fast path takes the parameters as data, an :class:`RMCWeights` (from
``RelationalMemoryCell.fast_weights()``), never the modules that own them.

Two entry points:

- :func:`fast_cell_step`, one step for ``RelationalMemoryCell`` (``implementation='fast'``).
  The cell sees one step only, so nothing is hoisted over time; it uses E4 (the last block's
  queries, residuals and MLP for the N memory rows only), E5 (b = 1: that is the whole step),
  E6 (``scaled_dot_product_attention``), E7 (N = n = 1: a two-key softmax is a sigmoid) and a
  single sigmoid over all gate columns with the four gate biases folded into one vector.
- :func:`fast_sequence`, a whole sequence for ``RelationalMemory``. On top of the step's
  equivalences it hoists all input-only work out of the time loop into batched GEMMs over
  chunks of time steps (all T·B rows unless the hoisted rows would outgrow the cache,
  :func:`hoist_chunk`): E1 (input projection), E2 (the input-gate term, with every gate bias
  folded in), E3 (block 1's input-row qkv + LayerNorm, and every block's with
  ``query_rows='memory'``), and on a CPU E13 where it saves work (:func:`fold_pays`: the input
  projection folded into those products, so that the projected rows are never formed). Lengths
  are applied once after the loop: outputs masked by one ``where``, the final state gathered
  from the stacked states at ``lengths - 1`` (E11/E12: the state of a finished example is never
  read again, so running it on is harmless). With grad mode on, an in-loop weight's gradient is
  computed once per sequence as one GEMM over all T·B rows (E10: ``_SequenceWeight`` and
  ``_LinearDeferred``) instead of one small GEMM per step, for every weight where
  :func:`deferral_pays` (always on a GPU; on a CPU when few rows meet a large weight).

The module also holds what describes the fast path: :func:`fast_path_plan` (the equivalences a
configuration uses) and its FLOP model, :func:`fast_path_products` and :func:`step_flops`.
The opt-in accelerations (``torch.compile``, CUDA graphs, bf16 matmuls) are
``FastRelationalMemory``'s, in :mod:`relmem.cores.rmc.module`.

Every option of ``docs/rmc.md`` §9 goes through the fast route; nothing falls back silently.

Shapes follow ``docs/rmc.md`` §1: B batch, T time, N slots, n input rows, F input features,
M = H·D, Q = H·(2K + D), W = (2 or 3)·g gate columns.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any, NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from relmem.cores.rmc.config import RMCConfig, RMCState

_EPS = 1e-5


class BlockWeights(NamedTuple):
    """One attention block's tensors (``AttentionBlock`` and the MLP it applies).

    Inside the fast path a weight may be a ``_BankedWeight`` instead of a tensor (E10).
    """

    qkv_w: Weight  # [Q, M]
    qkv_b: Tensor  # [Q]
    qkv_ln: tuple[Tensor, Tensor]  # γ, β [Q]
    attn_ln: tuple[Tensor, Tensor]  # γ, β [M]
    mlp_ln: tuple[Tensor, Tensor]  # γ, β [M]
    mlp: tuple[tuple[Weight, Tensor], ...]  # L × (W [M, M], b [M])


class RMCWeights(NamedTuple):
    """Every parameter of a cell, as the tensors the fast path reads.

    Attributes:
        input_w, input_b: ``[M, F]``, ``[M]`` the input projection.
        blocks: one :class:`BlockWeights` per block (a shared MLP appears in each).
        input_gate_w, input_gate_b: ``[W, n·M]``, ``[W]``; None without gating.
        memory_gate_w, memory_gate_b: ``[W, M]``, ``[W]``; None without gating.
        gate_biases: ``[num_gates]`` the trainable gate biases, or None when they are the
            config's constants.
    """

    input_w: Tensor
    input_b: Tensor
    blocks: tuple[BlockWeights, ...]
    input_gate_w: Tensor | None
    input_gate_b: Tensor | None
    memory_gate_w: Tensor | None
    memory_gate_b: Tensor | None
    gate_biases: Tensor | None


class _StepWeights(NamedTuple):
    """The tensors one recurrent step needs, gathered once per forward."""

    blocks: tuple[BlockWeights, ...]
    gate_w: Weight | None  # [W, M] the memory-gate weight (its bias is folded into gate_bias)
    gate_bias: Tensor | None  # [W] b_gm + b_gx + the constant (or trainable) gate biases


def fast_path_plan(config: RMCConfig, sequence: bool = True) -> list[str]:
    """The ``docs/rmc.md`` §10 equivalences the fast path applies to ``config``.

    Args:
        config: the core's configuration.
        sequence: True for :func:`fast_sequence`, False for one :func:`fast_cell_step`.

    Returns:
        Equivalence ids such as ``['E1', 'E2', 'E3', 'E4', 'E5', 'E6']``. E10 is listed for
        every sequence; which weights it banks depends on the batch and the device
        (:func:`deferral_pays`), so a CPU run may bank none of them. E13 is listed where the
        configuration allows it; whether a call folds depends on its rows and device
        (:func:`fold_pays`).
    """
    plan = []
    if sequence:
        plan.append("E1")
        if config.gate_style is not None:
            plan.append("E2")
        plan.append("E3")
    plan.append("E4")
    if config.num_blocks == 1:
        plan.append("E5")
    plan.append("E6")
    if config.mem_slots == 1 and config.num_input_rows == 1:
        plan.append("E7")
    if sequence:
        plan += ["E10", "E11" if config.output_gate else "E12"]
    if not (config.query_rows == "all" and config.num_blocks > 1):
        plan.append("E13")
    return plan


def _step_weights(config: RMCConfig, weights: RMCWeights) -> _StepWeights:
    """The in-loop tensors, with every gate bias folded into one ``[W]`` vector."""
    if config.gate_style is None:
        return _StepWeights(weights.blocks, None, None)
    assert weights.memory_gate_b is not None and weights.input_gate_b is not None
    g = config.gate_size
    if weights.gate_biases is not None:
        constant = weights.gate_biases.unsqueeze(1).expand(-1, g).reshape(-1)  # [W]
    else:
        # new_full, not torch.tensor: no host-to-device copy, so CUDA graph capture works.
        constant = torch.cat(
            [weights.memory_gate_b.new_full((g,), v) for v in config.gate_bias_constants]
        )
    # ±inf constants stay ±inf after the sum; the reference adds them last to finite values,
    # so σ sees the same ±inf and passes a zero gradient either way.
    gate_bias = weights.memory_gate_b + weights.input_gate_b + constant
    return _StepWeights(weights.blocks, weights.memory_gate_w, gate_bias)


def _layer_norm(x: Tensor, params: tuple[Tensor, Tensor]) -> Tensor:
    """Row-wise LayerNorm over the last axis (``docs/rmc.md`` §4.8)."""
    return F.layer_norm(x, x.shape[-1:], params[0], params[1], _EPS)


class _GradBank:
    """The ``(input rows, output gradient)`` pairs of one weight's in-loop uses (E10), filled
    and emptied within one backward pass."""

    def __init__(self) -> None:
        self.inputs: list[Tensor] = []
        self.grads: list[Tensor] = []

    def add(self, inputs: Tensor, grads: Tensor) -> None:
        """Bank one use's ``[rows, in]`` inputs and ``[rows, out]`` output gradient.

        A backward pass that does not reach the weight (``torch.autograd.grad`` of the inputs
        alone, ``backward(inputs=...)``) runs the uses' backward but not
        :class:`_SequenceWeight`'s, so the first deposit of a pass also asks the autograd
        engine to empty the bank when the pass ends: a later pass over the same graph
        (``retain_graph=True``) must not count these pairs again.
        """
        if not self.grads:
            torch.autograd.Variable._execution_engine.queue_callback(self.clear)
        self.inputs.append(inputs)
        self.grads.append(grads)

    def clear(self) -> None:
        self.inputs, self.grads = [], []


class _BankedWeight(NamedTuple):
    """A weight whose gradient is computed once per sequence from ``bank`` (E10)."""

    weight: Tensor  # [out, in], the alias made by _SequenceWeight
    bank: _GradBank


class _SequenceWeight(torch.autograd.Function):
    """Identity on a weight, applied once per sequence; its backward runs after every step's
    backward (every step consumes its output) and computes ``dW = Σ_t g_tᵀ x_t`` as one GEMM
    over all T·B·rows.

    Both backward passes here are made of differentiable operations: with ``create_graph=True``
    they record their own graph, in which ``dy·W`` reaches the weight through this alias again
    (the bank is empty by then, so that gradient passes through unchanged)."""

    @staticmethod
    def forward(ctx: Any, weight: Tensor, bank: _GradBank) -> Tensor:
        ctx.bank = bank
        ctx.set_materialize_grads(False)  # every use returns None for the weight
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx: Any, grad: Tensor | None) -> tuple[Tensor | None, None]:
        bank = ctx.bank
        if bank.grads:
            banked = torch.cat(bank.grads).t() @ torch.cat(bank.inputs)  # [out, in]
            grad = banked if grad is None else grad + banked
        bank.clear()
        return grad, None


class _LinearDeferred(torch.autograd.Function):
    """``x·Wᵀ + b`` whose backward returns dx and db now and banks (x, dy) for dW (E10)."""

    @staticmethod
    def forward(
        ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None, bank: _GradBank
    ) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.bank, ctx.has_bias = bank, bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, Tensor | None, None]:
        x, weight = ctx.saved_tensors
        grad_rows = grad.reshape(-1, grad.shape[-1])  # [rows, out]
        ctx.bank.add(x.reshape(-1, x.shape[-1]), grad_rows)
        grad_bias = grad_rows.sum(0) if ctx.has_bias else None
        grad_x = grad @ weight if ctx.needs_input_grad[0] else None
        # No weight gradient here: _SequenceWeight computes it from the bank.
        return grad_x, None, grad_bias, None


Weight = Tensor | _BankedWeight


def _linear(x: Tensor, weight: Weight, bias: Tensor | None = None) -> Tensor:
    """``F.linear``, or its weight-gradient-deferred form for a banked weight."""
    if isinstance(weight, _BankedWeight):
        return _LinearDeferred.apply(x, weight.weight, bias, weight.bank)
    return F.linear(x, weight, bias)


def _mlp(x: Tensor, layers: tuple[tuple[Weight, Tensor], ...]) -> Tensor:
    """L linear layers with ReLU between them, none after the last: ``[..., M] -> [..., M]``."""
    for index, (weight, bias) in enumerate(layers):
        if index > 0:
            x = F.relu(x)
        x = _linear(x, weight, bias)
    return x


def _qkv(rows: Tensor, block: BlockWeights) -> Tensor:
    """``LN_qkv(rows·W_qkv + b)``: ``[..., M] -> [..., Q]`` (head-major columns)."""
    return _layer_norm(_linear(rows, block.qkv_w, block.qkv_b), block.qkv_ln)


def _autocast_on(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` (False for types it does not know, 'meta')."""
    return torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type)


def _attend(z: Tensor, num_queries: int, heads: int, key: int, value: int) -> Tensor:
    """Multi-head attention of the first ``num_queries`` rows over all rows.

    Args:
        z: ``[B, R, Q]`` the normalised qkv rows, head-major ``[q_0 k_0 v_0 | q_1 …]``.
        num_queries: R_q, the rows that issue queries (the first R_q).
        heads, key, value: H, K, D.

    Returns:
        ``[B, R_q, M]`` the heads' outputs concatenated per row (no output projection).
    """
    batch, rows, _ = z.shape
    autocast = _autocast_on(z.device.type)
    if autocast:
        # Under autocast (FastRelationalMemory's matmul_dtype, a training run's bf16) the
        # attention runs in float32, softmax included, as FastRelationalMemory documents;
        # autocast would run SDPA wholly in bf16 (docs/performance.md §4.13). Over N + n keys
        # its cost is small beside the GEMMs'.
        z = z.float()
    z = z.view(batch, rows, heads, 2 * key + value).transpose(1, 2)  # [B, H, R, 2K+D]
    q, k, v = z.split([key, key, value], dim=-1)
    q = q[:, :, :num_queries]  # [B, H, R_q, K]
    scale = key**-0.5
    if rows == 2:  # E7: softmax over two keys is σ(s0 − s1) and its complement
        k0, k1 = k.unbind(2)  # [B, H, K] each
        v0, v1 = v.unbind(2)  # [B, H, D] each
        logit = (q * (k0 - k1).unsqueeze(2)).sum(-1, keepdim=True) * scale  # [B, H, R_q, 1]
        out = v1.unsqueeze(2) + torch.sigmoid(logit) * (v0 - v1).unsqueeze(2)  # [B, H, R_q, D]
    else:  # E6: the fused kernel, scale K^-1/2, no mask, no dropout
        with torch.autocast(z.device.type, enabled=False) if autocast else nullcontext():
            out = F.scaled_dot_product_attention(q, k, v, scale=scale)  # [B, H, R_q, D]
    return out.transpose(1, 2).reshape(batch, num_queries, heads * value)


class _StepSpec(NamedTuple):
    """Static facts the step needs (hashable, so a compiled step specialises on them)."""

    slots: int  # N
    heads: int  # H
    key: int  # K
    value: int  # D
    gate: int  # g (0 without gating)
    query_all: bool  # query_rows == 'all'
    output_gate: bool


def recurrent_step(
    spec: _StepSpec,
    weights: _StepWeights,
    memory: Tensor,
    hidden: Tensor | None,
    x: Tensor | None,
    z_inputs: tuple[Tensor | None, ...],
    gate_x: Tensor | None,
) -> tuple[Tensor, Tensor | None]:
    """One recurrent step with the input-only work already done.

    Args:
        spec: static sizes and options.
        weights: from :func:`_step_weights`.
        memory: ``[B, N, M]`` m_{t-1}.
        hidden: ``[B, N, M]`` h_{t-1} with ``output_gate``, else None.
        x: ``[B, n, M]`` the projected input rows, or None where no block reads them (E13).
        z_inputs: per block, the input rows' precomputed ``LN_qkv(x·W + b)`` ``[B, n, Q]``
            (E3), or None where the input rows must be processed inside the step.
        gate_x: ``[B, W]`` ``flat(x)·W_gx`` plus every gate bias (E2), or None (no gating).

    Returns:
        ``(m_t, h_t)``: ``[B, N, M]`` each (h_t is None without ``output_gate``).
    """
    n_slots = spec.slots
    rows_mem, rows_in = memory, x  # [B, N, M], [B, n, M]
    last = len(weights.blocks) - 1
    for index, block in enumerate(weights.blocks):
        z_in = z_inputs[index]
        full = spec.query_all and index < last  # blocks before the last update the input rows
        if z_in is None or full:  # the step reads the input rows themselves
            assert rows_in is not None, "E13 applies only where no block reads the input rows"
        if z_in is None:  # the input rows were updated by the previous block
            z = _qkv(torch.cat([rows_mem, cast(Tensor, rows_in)], dim=1), block)  # [B, N+n, Q]
        else:
            z = torch.cat([_qkv(rows_mem, block), z_in], dim=1)  # [B, N+n, Q]
        # E4: the last block (and every block with query_rows='memory') updates memory rows only
        residual = (  # [B, R_q, M]
            torch.cat([rows_mem, cast(Tensor, rows_in)], dim=1) if full else rows_mem
        )
        attended = _attend(z, residual.shape[1], spec.heads, spec.key, spec.value)
        h = _layer_norm(residual + attended, block.attn_ln)
        h = _layer_norm(_mlp(h, block.mlp) + h, block.mlp_ln)
        if full:
            rows_mem, rows_in = h[:, :n_slots], h[:, n_slots:]
        else:
            rows_mem = h
    if gate_x is None:  # 4.6: no gating
        return rows_mem, None
    assert weights.gate_w is not None
    recurrent = cast(Tensor, hidden) if spec.output_gate else torch.tanh(memory)
    gates = torch.sigmoid(_linear(recurrent, weights.gate_w) + gate_x.unsqueeze(1))  # [B,N,W]
    g = spec.gate
    new_memory = gates[..., :g] * torch.tanh(rows_mem) + gates[..., g : 2 * g] * memory
    if not spec.output_gate:
        return new_memory, None
    return new_memory, gates[..., 2 * g :] * torch.tanh(new_memory)


def _step_spec(config: RMCConfig) -> _StepSpec:
    return _StepSpec(
        config.mem_slots,
        config.num_heads,
        config.resolved_key_size,
        config.head_size,
        config.gate_size,
        config.query_rows == "all",
        config.output_gate,
    )


class _Hoisted(NamedTuple):
    """Input-only work for every step, computed in batched GEMMs (E1–E3, E13)."""

    x: Tensor | None  # [T, B, n, M]; None with E13 (no step reads the projected rows)
    z_inputs: tuple[Tensor | None, ...]  # per block [T, B, n, Q] or None
    gate_x: Tensor | None  # [T, B, W]


def fold_pays(config: RMCConfig, rows: Tensor) -> bool:
    """Whether :func:`_hoist` folds the input projection into the input rows' qkv (E13).

    With every block's input-row qkv hoisted (E3 for all blocks: ``query_rows='memory'``, or
    one block) no step reads the projected input rows x = u·W_inᵀ + b_in, and their qkv
    ``x·W_qkvᵀ + b_qkv`` is linear in the inputs u: ``u·(W_qkv·W_in)ᵀ + (W_qkv·b_in + b_qkv)``.
    Multiplying the weights first costs Q·M·F once per call and saves (M − F)·Q per input row
    (and x itself, F·M per row, without gating; the gate term still reads x: folded too, its
    float32 rounding moved a gate bias's gradient 2.5e-5 from float64's, against the
    reference's 1.7e-5, for a saving of (M − F)·W per row). It pays when the inputs are
    narrower than the memory rows (the RL agent's 26 features per cell against rows of 64
    to 256) and the rows outnumber what folding costs.

    Applied on the CPU only: no GPU has run it yet.

    Args:
        config: the core. rows: ``[..., n, F]`` the inputs of one hoisting call.
    """
    if rows.device.type != "cpu" or "E13" not in fast_path_plan(config, sequence=False):
        return False
    features, width = config.input_size, config.mem_size
    qkv = config.qkv_size * config.num_blocks  # the hoisted qkv columns per row
    count = rows.numel() // max(features, 1)  # input rows in this call
    per_row_saved = (width - features) * qkv
    if config.gate_style is None:
        per_row_saved += features * width  # x is not formed
    return count * per_row_saved > qkv * width * features


def _raw(weight: Weight) -> Tensor:
    """The tensor of a weight, banked (E10) or not."""
    return weight.weight if isinstance(weight, _BankedWeight) else weight


def _hoist(
    config: RMCConfig, weights: RMCWeights, step_weights: _StepWeights, rows: Tensor
) -> _Hoisted:
    """E1 (projection), E2 (input-gate term), E3 (input-row qkv+LN where exact), E13 (the
    projection folded into the input rows' qkv) where :func:`fold_pays`.

    Args:
        rows: ``[..., n, F]`` inputs of any leading shape (``[T, B]`` or ``[B]``).
    """
    blocks = step_weights.blocks
    fold = fold_pays(config, rows)
    x = None  # [..., n, M]; with E13 only the gate term reads it
    if not fold or config.gate_style is not None:
        x = F.linear(rows, weights.input_w, weights.input_b)
    z_inputs: tuple[Tensor | None, ...]  # per block: [..., n, Q], or None (in the step)
    if fold:
        z_inputs = tuple(_folded_qkv(rows, weights, block) for block in blocks)
    elif config.query_rows == "memory":  # input rows never change: every block's qkv hoists
        assert x is not None  # no fold: projected above
        z_inputs = tuple(_qkv(x, block) for block in blocks)
    else:  # only block 1 sees the raw x
        assert x is not None
        z_inputs = (_qkv(x, blocks[0]), *[None] * (len(blocks) - 1))
    gate_x = None
    if config.gate_style is not None:
        assert weights.input_gate_w is not None and step_weights.gate_bias is not None
        assert x is not None
        gate_x = F.linear(x.flatten(-2), weights.input_gate_w, step_weights.gate_bias)  # [..., W]
    return _Hoisted(x, z_inputs, gate_x)


def _folded_qkv(rows: Tensor, weights: RMCWeights, block: BlockWeights) -> Tensor:
    """E13: the input rows' ``LN_qkv(x·W_qkvᵀ + b_qkv)`` from the inputs ``rows [..., n, F]``,
    as ``LN(u·(W_qkv·W_in)ᵀ + (W_qkv·b_in + b_qkv))`` ``[..., n, Q]``."""
    w_qkv = _raw(block.qkv_w)  # [Q, M]
    bias = F.linear(weights.input_b, w_qkv, block.qkv_b)  # [Q]
    # One GEMM over the rows made 2-D (a copy of F columns where rows is a strided view): on
    # such a view F.linear would broadcast the weight into a bmm, 30x slower at the RL
    # agent's [1, 2560, 64, 26].
    flat = rows.reshape(-1, rows.shape[-1])  # [rows, F]
    folded = torch.addmm(bias, flat, (w_qkv @ weights.input_w).t())  # [rows, Q]
    return _layer_norm(folded.view(*rows.shape[:-1], -1), block.qkv_ln)


HOIST_CHUNK_BYTES = 8 * 2**20


def hoist_chunk(config: RMCConfig, rows: Tensor) -> int:
    """Time steps per hoisting chunk in :func:`fast_sequence` (E1–E3 run once per chunk).

    On a CPU, hoisting over all T·B rows at once makes ``[T, B, n, Q]`` intermediates; with
    many input rows (matrix mode: the RL agent's one row per cell) they outgrow the cache and
    the steps read their slices back from memory: a whole sequence ran slower than the same
    steps fed in chunks of 1 to 5 (``docs/performance.md`` §4.5). A chunk holds at most
    :data:`HOIST_CHUNK_BYTES` of hoisted rows. On a GPU (launch-bound) it is the whole
    sequence.

    Args:
        config: the core. rows: ``[T, B, n, F]`` the sequence's input.

    Returns:
        A chunk length in ``1..T``.
    """
    steps, batch = rows.shape[0], rows.shape[1]
    if rows.device.type != "cpu":
        return steps
    blocks = config.num_blocks if config.query_rows == "memory" else 1
    width = config.mem_size + config.qkv_size * blocks  # x and the hoisted qkv rows
    per_step = batch * config.num_input_rows * width * rows.element_size()
    return max(1, min(steps, HOIST_CHUNK_BYTES // max(per_step, 1)))


def deferral_pays(weight_shape: tuple[int, int], rows_per_step: int, device: torch.device) -> bool:
    """Whether E10 is expected to be faster for one in-loop weight (the ``'auto'`` rule).

    On a GPU the eager step is launch-bound, and E10 removes two kernels per weight per step
    (the small dW GEMM and its accumulation): it always pays. On a CPU it trades memory traffic:
    the bank concatenates ``rows · (in + out)`` floats per step, while per-step gradients
    accumulate an ``in · out`` product per step. Deferral pays when the bank is the smaller,
    ``rows · (in + out) < in · out``, i.e. when few rows (small batch, one slot) meet a large
    weight (the measurements behind the rule are in ``docs/performance.md`` §4.1).

    Args:
        weight_shape: ``(out, in)``.
        rows_per_step: rows the weight multiplies in one step (B·N, or B·(N+n) in blocks that
            update the input rows).
        device: where the step runs.
    """
    if device.type != "cpu":
        return True
    out_features, in_features = weight_shape
    return rows_per_step * (in_features + out_features) < in_features * out_features


def _defer_weight_grads(weights: _StepWeights, rows_per_step: int | None = None) -> _StepWeights:
    """Route in-loop weights through one :class:`_SequenceWeight` per tensor (E10).

    A weight shared by several blocks (the shared MLP) gets one bank, so its gradient is still
    one GEMM. Weights that need no gradient are left as they are.

    Args:
        weights: from :func:`_step_weights`.
        rows_per_step: when given, only the weights for which :func:`deferral_pays` at this
            many rows per step are banked; when None, every weight is.
    """
    banked: dict[int, Weight] = {}

    def bank(weight: Weight) -> Weight:
        if not isinstance(weight, Tensor) or not weight.requires_grad:
            return weight
        shape = (weight.shape[0], weight.shape[1])
        if rows_per_step is not None and not deferral_pays(shape, rows_per_step, weight.device):
            return weight
        if id(weight) not in banked:
            grads = _GradBank()
            banked[id(weight)] = _BankedWeight(_SequenceWeight.apply(weight, grads), grads)
        return banked[id(weight)]

    blocks = tuple(
        block._replace(qkv_w=bank(block.qkv_w), mlp=tuple((bank(w), b) for w, b in block.mlp))
        for block in weights.blocks
    )
    gate_w = None if weights.gate_w is None else bank(weights.gate_w)
    return weights._replace(blocks=blocks, gate_w=gate_w)


StepFn = Callable[..., tuple[Tensor, "Tensor | None"]]
# (spec, weights, memory, hidden, hoisted) -> ([t, B, N, M] memories, hiddens or None)
SequenceFn = Callable[..., tuple[Tensor, "Tensor | None"]]


def fast_cell_step(
    config: RMCConfig,
    weights: RMCWeights,
    rows: Tensor,
    state: RMCState,
    sequence_fn: SequenceFn | None = None,
) -> tuple[Tensor, RMCState]:
    """One step, equal to the reference step without its details.

    Args:
        config: the cell's configuration.
        weights: the cell's parameters (``RelationalMemoryCell.fast_weights()``).
        rows: ``[B, n, F]`` the validated step input.
        state: validated :class:`RMCState`.
        sequence_fn: None: :func:`recurrent_step`; else the step runs as a sequence of one
            through it (the fused CPU path's :func:`relmem.cores.rmc.fused.fused_sequence`).

    Returns:
        ``(output [B, N·M], new state)``.
    """
    spec = _step_spec(config)
    step_weights = _step_weights(config, weights)
    if sequence_fn is None:
        hoisted = _hoist(config, weights, step_weights, rows)
        memory, hidden = recurrent_step(
            spec,
            step_weights,
            state.memory,
            state.hidden,
            hoisted.x,
            hoisted.z_inputs,
            hoisted.gate_x,
        )
    else:  # [1, B, ...] time axes in and out
        hoisted = _hoist(config, weights, step_weights, rows.unsqueeze(0))
        memories, hiddens = sequence_fn(spec, step_weights, state.memory, state.hidden, hoisted)
        memory, hidden = memories[0], None if hiddens is None else hiddens[0]
    output = (memory if hidden is None else hidden).flatten(1)
    return output, RMCState(memory, hidden)


def fast_sequence(
    config: RMCConfig,
    weights: RMCWeights,
    rows: Tensor,
    state: RMCState,
    lengths: Tensor | None,
    step_fn: StepFn = recurrent_step,
    defer_weight_grads: bool | None = None,
    sequence_fn: SequenceFn | None = None,
) -> tuple[Tensor, RMCState]:
    """The whole sequence, equal to ``run_cell_loop`` over the reference step.

    Args:
        config: the core's configuration.
        weights: the cell's parameters (``RelationalMemoryCell.fast_weights()``).
        rows: ``[T, B, n, F]`` the validated, time-major input.
        state: validated initial :class:`RMCState` (``memory [B, N, M]``).
        lengths: optional ``[B]`` int64 valid lengths in ``0..T``.
        step_fn: the recurrent step (:func:`recurrent_step`, or a compiled version of it).
        defer_weight_grads: E10: compute an in-loop weight's gradient once per sequence, as
            one GEMM over all T·B rows, instead of one small GEMM per step. None (default):
            for the weights where :func:`deferral_pays`; True: for every weight; False: never.
            Only with grad mode on, autocast off and outside a graph being traced by
            ``torch.compile`` or ``torch.export``; ``FastRelationalMemory`` turns it off for its
            compiled and graphed runs.
        sequence_fn: runs each hoisting chunk's steps at once instead of calling ``step_fn`` per
            step (the fused CPU path's :func:`relmem.cores.rmc.fused.fused_sequence`); E10 does
            not apply with it.

    Returns:
        ``(outputs [T, B, N·M], final state)``; outputs past an example's length are zero and
        its final state is the one after its last valid step.
    """
    spec = _step_spec(config)
    step_weights = _step_weights(config, weights)
    # Autocast would hand the deferred linears mixed dtypes; E10 is for full-precision runs.
    autocast = _autocast_on(rows.device.type)
    # E10's bank is Python state that a backward fills: a graph being traced (torch.compile,
    # torch.export) cannot hold it, and there the compiler schedules the weight GEMMs itself.
    traced = torch.compiler.is_compiling()
    defer = defer_weight_grads is not False and sequence_fn is None
    if defer and torch.is_grad_enabled() and not autocast and not traced:
        if defer_weight_grads is None:  # only the weights for which deferral pays
            batch, rows_in = rows.shape[1], rows.shape[2]
            updates_input_rows = spec.query_all and len(step_weights.blocks) > 1
            rows_per_step = batch * (spec.slots + (rows_in if updates_input_rows else 0))
            step_weights = _defer_weight_grads(step_weights, rows_per_step)
        else:
            step_weights = _defer_weight_grads(step_weights)
    memory, hidden = state.memory, state.hidden
    chunks_m, chunks_h = [], []  # [t, B, N, M] per hoisting chunk
    for chunk in rows.split(hoist_chunk(config, rows)):
        hoisted = _hoist(config, weights, step_weights, chunk)
        if sequence_fn is None:
            chunk_m, chunk_h = _step_loop(step_fn, spec, step_weights, memory, hidden, hoisted)
        else:
            chunk_m, chunk_h = sequence_fn(spec, step_weights, memory, hidden, hoisted)
        memory, hidden = chunk_m[-1], None if chunk_h is None else chunk_h[-1]
        chunks_m.append(chunk_m)
        if chunk_h is not None:
            chunks_h.append(chunk_h)
    stacked_m = _join(chunks_m)  # [T, B, N, M]; E12: the outputs are these memories
    stacked_h = _join(chunks_h) if chunks_h else None
    shown = stacked_m if stacked_h is None else stacked_h
    outputs = shown.flatten(2)  # [T, B, N·M]
    if lengths is None:
        # Copies, not views of the outputs: an in-place change to the outputs (dropout,
        # masked_fill_) must not reach the state carried into the next window. [B, N, M] each.
        final_h = None if stacked_h is None else stacked_h[-1].clone()
        return outputs, RMCState(stacked_m[-1].clone(), final_h)
    steps, batch = outputs.shape[:2]
    time = torch.arange(steps, device=lengths.device)
    active = (time.unsqueeze(1) < lengths.unsqueeze(0)).unsqueeze(-1)  # [T, B, 1]
    outputs = torch.where(active, outputs, outputs.new_zeros(()))
    examples = torch.arange(batch, device=lengths.device)

    def final(initial: Tensor, stacked: Tensor) -> Tensor:
        # [T+1, B, N, M] with the initial state at index 0, read at index lengths[b].
        return torch.cat([initial.unsqueeze(0), stacked])[lengths, examples]

    final_m = final(state.memory, stacked_m)
    final_h = None
    if stacked_h is not None:
        assert state.hidden is not None
        final_h = final(state.hidden, stacked_h)
    return outputs, RMCState(final_m, final_h)


def _step_loop(
    step_fn: StepFn,
    spec: _StepSpec,
    weights: _StepWeights,
    memory: Tensor,
    hidden: Tensor | None,
    hoisted: _Hoisted,
) -> tuple[Tensor, Tensor | None]:
    """One chunk's steps, one ``step_fn`` call each: ``([t, B, N, M] memories, hiddens or
    None)``."""
    steps = _hoisted_steps(hoisted)
    # unbind, not indexing: the backward of x[t] would zero-fill a [t, ...] buffer per step
    # (quadratic in t); unbind's stacks the slices' gradients once.
    xs = (None,) * steps if hoisted.x is None else hoisted.x.unbind(0)
    zs = [(None,) * steps if z is None else z.unbind(0) for z in hoisted.z_inputs]
    gates = (None,) * steps if hoisted.gate_x is None else hoisted.gate_x.unbind(0)
    memories, hiddens = [], []
    for t in range(steps):
        z_t = tuple(z[t] for z in zs)
        memory, hidden = step_fn(spec, weights, memory, hidden, xs[t], z_t, gates[t])
        memories.append(memory)
        if hidden is not None:
            hiddens.append(hidden)
    return torch.stack(memories), torch.stack(hiddens) if hiddens else None


def _hoisted_steps(hoisted: _Hoisted) -> int:
    """The time steps of a hoisting chunk (block 1's input-row qkv is always hoisted)."""
    z = hoisted.z_inputs[0]
    assert z is not None
    return z.shape[0]


def _join(chunks: list[Tensor]) -> Tensor:
    """The chunks' ``[t, ...]`` tensors along time (no copy for one chunk)."""
    return chunks[0] if len(chunks) == 1 else torch.cat(chunks)


# ---------------------------------------------------------------- the FLOP model


class Product(NamedTuple):
    """One matmul of a step, ``[rows·B, inputs] @ [inputs, outputs]``: 2·rows·inputs·outputs
    FLOPs per example."""

    rows: int  # rows per example
    inputs: int
    outputs: int

    @property
    def flops(self) -> int:
        return 2 * self.rows * self.inputs * self.outputs


def fast_path_products(config: RMCConfig, folded: bool = False) -> dict[str, list[Product]]:
    """The matmuls of the fast path, per example and step.

    Args:
        config: the core.
        folded: with E13 (:func:`fold_pays`): the input rows' qkv straight from the inputs,
            and the projection only where the gate term reads it.

    Returns:
        ``loop``: the weight matmuls inside the time loop, run once per step; ``attention``:
        per block, its two attention products as one entry (R_q query rows against N+n keys,
        H·(K+D) columns: ``q·kᵀ`` and ``w·v`` together); ``hoisted``: the weight matmuls E1–E3
        move out of the loop, run once per sequence over T·B examples.
    """
    n_slots, n_in, blocks = config.mem_slots, config.num_input_rows, config.num_blocks
    m, q, layers = config.mem_size, config.qkv_size, config.attention_mlp_layers
    heads = config.num_heads * (config.resolved_key_size + config.head_size)
    gates = config.num_gates * config.gate_size
    loop: list[Product] = []
    attention: list[Product] = []
    for index in range(blocks):
        if config.query_rows == "memory" or blocks == 1:
            qkv_rows, query_rows = n_slots, n_slots
        else:  # query_rows='all': earlier blocks also update the input rows (E4 on the last)
            qkv_rows = n_slots if index == 0 else n_slots + n_in
            query_rows = n_slots if index == blocks - 1 else n_slots + n_in
        loop.append(Product(qkv_rows, m, q))
        attention.append(Product(query_rows, n_slots + n_in, heads))
        loop += [Product(query_rows, m, m)] * layers
    hoisted_blocks = blocks if config.query_rows == "memory" else 1
    if folded:
        hoisted = [Product(n_in, config.input_size, q)] * hoisted_blocks
        if config.gate_style is not None:
            hoisted.insert(0, Product(n_in, config.input_size, m))
    else:
        hoisted = [Product(n_in, config.input_size, m)] + [Product(n_in, m, q)] * hoisted_blocks
    if config.gate_style is not None:
        loop.append(Product(n_slots, m, gates))
        hoisted.append(Product(1, n_in * m, gates))
    return {"loop": loop, "attention": attention, "hoisted": hoisted}


def step_flops(config: RMCConfig) -> dict[str, int]:
    """Matmul FLOPs per example per time step, forward only (backward is about twice this).

    Counts 2·m·k·n per product; LayerNorm, softmax and gates are O(rows·width) and left out.

    Args:
        config: the core.

    Returns:
        ``reference``: what the plain loop computes per step (all N+n rows in every block);
        ``fast_loop``: what stays inside the fast path's time loop; ``fast_hoisted``: what the
        fast path moves into batched GEMMs over T·B rows (E1–E3); see
        :func:`fast_path_products`.
    """
    n_slots, n_in = config.mem_slots, config.num_input_rows
    rows = n_slots + n_in
    m, q, f = config.mem_size, config.qkv_size, config.input_size
    heads = config.num_heads * (config.resolved_key_size + config.head_size)
    block = [Product(rows, m, q), Product(rows, rows, heads)]
    block += [Product(rows, m, m)] * config.attention_mlp_layers
    reference = [Product(n_in, f, m)] + block * config.num_blocks
    if config.gate_style is not None:
        gates = config.num_gates * config.gate_size
        reference += [Product(1, n_in * m, gates), Product(n_slots, m, gates)]
    fast = fast_path_products(config)
    return {
        "reference": sum(p.flops for p in reference),
        "fast_loop": sum(p.flops for p in fast["loop"] + fast["attention"]),
        "fast_hoisted": sum(p.flops for p in fast["hoisted"]),
    }
