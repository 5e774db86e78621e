"""The fast Relational Memory Core path: the reference's function, computed with fewer ops.

Every transformation here is one of the exact equivalences of ``specs/rmc.md`` section 10; the
reference (:meth:`RelationalMemoryCell.step` inside :func:`relmem.cores.base.run_cell_loop`) is
the test oracle (``tests/cores/test_rmc_fast.py``).

Three entry points:

- :func:`fast_cell_step`, one step for :class:`RelationalMemoryCell` (``implementation='fast'``).
  The cell sees one step only, so nothing is hoisted over time; it uses E4 (the last block's
  queries, residuals and MLP for the N memory rows only), E5 (b = 1: that is the whole step),
  E6 (``scaled_dot_product_attention``), E7 (N = n = 1: a two-key softmax is a sigmoid) and a
  single sigmoid over all gate columns with the four gate biases folded into one vector.
- :func:`fast_sequence`, a whole sequence for :class:`RelationalMemory`. On top of the step's
  equivalences it hoists all input-only work out of the time loop into one batched GEMM over
  T·B rows: E1 (input projection), E2 (the input-gate term, with every gate bias folded in), E3
  (block 1's input-row qkv + LayerNorm, and every block's with ``query_rows='memory'``). Lengths
  are applied once after the loop: outputs masked by one ``where``, the final state gathered
  from the stacked states at ``lengths - 1`` (E11/E12: the state of a finished example is never
  read again, so running it on is harmless). With grad mode on, an in-loop weight's gradient is
  computed once per sequence as one GEMM over all T·B rows (E10: ``_SequenceWeight`` and
  ``_LinearDeferred``) instead of one small GEMM per step, for every weight where
  :func:`deferral_pays` (always on a GPU; on a CPU when few rows meet a large weight).
- :class:`FastRelationalMemory`, a wrapper adding the options that are not on by default:
  ``compile=True`` (``torch.compile`` of the recurrent step), ``cuda_graph=True`` (on CUDA, the
  whole fixed-shape sequence, forward and backward, captured with
  ``torch.cuda.make_graphed_callables``) and ``matmul_dtype=torch.bfloat16`` (autocast: bf16
  matmuls; LayerNorm, softmax and the recurrent state stay fp32; not exact, spec section 10).

Every option of spec section 9 goes through the fast route; nothing falls back silently. The
list of equivalences a configuration uses is :func:`fast_path_plan`.

Shapes follow spec section 1: B batch, T time, N slots, n input rows, M = H·D, Q = H·(2K + D),
W = (2 or 3)·g gate columns.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

if TYPE_CHECKING:
    from relmem.cores.rmc import RelationalMemory, RelationalMemoryCell, RMCConfig, RMCState

_EPS = 1e-5


class _Block(NamedTuple):
    """One attention block's tensors (see ``AttentionBlock``)."""

    qkv_w: Weight  # [Q, M]
    qkv_b: Tensor  # [Q]
    qkv_ln: tuple[Tensor, Tensor]  # γ, β [Q]
    attn_ln: tuple[Tensor, Tensor]  # γ, β [M]
    mlp_ln: tuple[Tensor, Tensor]  # γ, β [M]
    mlp: tuple[tuple[Weight, Tensor], ...]  # L × (W [M, M], b [M])


class _Weights(NamedTuple):
    """The tensors one step needs, gathered once per forward."""

    blocks: tuple[_Block, ...]
    gate_w: Weight | None  # [W, M] the memory-gate weight (its bias is folded into gate_bias)
    gate_bias: Tensor | None  # [W] b_gm + b_gx + the constant (or trainable) gate biases


def fast_path_plan(config: RMCConfig, sequence: bool = True) -> list[str]:
    """The spec section 10 equivalences the fast path applies to ``config``.

    Args:
        config: the core's configuration.
        sequence: True for :func:`fast_sequence`, False for one :func:`fast_cell_step`.

    Returns:
        Equivalence ids such as ``['E1', 'E2', 'E3', 'E4', 'E5', 'E6']``. E10 is listed for
        every sequence; which weights it banks depends on the batch and the device
        (:func:`deferral_pays`), so a CPU run may bank none of them.
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
    return plan


def _gather_weights(cell: RelationalMemoryCell) -> _Weights:
    cfg = cell.config
    blocks = []
    for index, block in enumerate(cell.blocks):
        mlp = cell.mlp_for_block(index)
        blocks.append(
            _Block(
                block.qkv.weight,
                block.qkv.bias,
                (block.qkv_norm.weight, block.qkv_norm.bias),
                (block.attention_norm.weight, block.attention_norm.bias),
                (block.mlp_norm.weight, block.mlp_norm.bias),
                tuple((layer.weight, layer.bias) for layer in mlp.layers),
            )
        )
    if cfg.gate_style is None:
        return _Weights(tuple(blocks), None, None)
    assert cell.input_gate is not None and cell.memory_gate is not None
    g = cfg.gate_size
    if cell.gate_biases is not None:
        constant = cell.gate_biases.unsqueeze(1).expand(-1, g).reshape(-1)  # [W]
    else:
        values = [cfg.input_bias, cfg.forget_bias, cfg.output_bias][: cfg.num_gates]
        # new_full, not torch.tensor: no host-to-device copy, so CUDA graph capture works.
        constant = torch.cat([cell.memory_gate.bias.new_full((g,), v) for v in values])
    # ±inf constants stay ±inf after the sum; the reference adds them last to finite values,
    # so σ sees the same ±inf and passes a zero gradient either way.
    gate_bias = cell.memory_gate.bias + cell.input_gate.bias + constant
    return _Weights(tuple(blocks), cell.memory_gate.weight, gate_bias)


def _layer_norm(x: Tensor, params: tuple[Tensor, Tensor]) -> Tensor:
    """Row-wise LayerNorm over the last axis (spec 4.8)."""
    return F.layer_norm(x, x.shape[-1:], params[0], params[1], _EPS)


class _GradBank:
    """The ``(input rows, output gradient)`` pairs of one weight's in-loop uses (E10)."""

    def __init__(self) -> None:
        self.inputs: list[Tensor] = []
        self.grads: list[Tensor] = []


class _BankedWeight(NamedTuple):
    """A weight whose gradient is computed once per sequence from ``bank`` (E10)."""

    weight: Tensor  # [out, in], the alias made by _SequenceWeight
    bank: _GradBank


class _SequenceWeight(torch.autograd.Function):
    """Identity on a weight, applied once per sequence; its backward runs after every step's
    backward (every step consumes its output) and computes ``dW = Σ_t g_tᵀ x_t`` as one GEMM
    over all T·B·rows."""

    @staticmethod
    def forward(ctx: Any, weight: Tensor, bank: _GradBank) -> Tensor:
        ctx.bank = bank
        ctx.set_materialize_grads(False)  # every use returns None for the weight
        return weight.view_as(weight)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: Tensor | None) -> tuple[Tensor | None, None]:
        bank = ctx.bank
        if bank.grads:
            banked = torch.cat(bank.grads).t() @ torch.cat(bank.inputs)  # [out, in]
            grad = banked if grad is None else grad + banked
        bank.inputs, bank.grads = [], []
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
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, Tensor | None, None]:
        x, weight = ctx.saved_tensors
        grad_rows = grad.reshape(-1, grad.shape[-1])  # [rows, out]
        ctx.bank.inputs.append(x.reshape(-1, x.shape[-1]))  # [rows, in]
        ctx.bank.grads.append(grad_rows)
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


def _qkv(rows: Tensor, block: _Block) -> Tensor:
    """``LN_qkv(rows·W_qkv + b)``: ``[..., M] -> [..., Q]`` (head-major columns)."""
    return _layer_norm(_linear(rows, block.qkv_w, block.qkv_b), block.qkv_ln)


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


def _step(
    spec: _StepSpec,
    weights: _Weights,
    memory: Tensor,
    hidden: Tensor | None,
    x: Tensor,
    z_inputs: tuple[Tensor | None, ...],
    gate_x: Tensor | None,
) -> tuple[Tensor, Tensor | None]:
    """One recurrent step with the input-only work already done.

    Args:
        spec: static sizes and options.
        weights: from :func:`_gather_weights`.
        memory: ``[B, N, M]`` m_{t-1}.
        hidden: ``[B, N, M]`` h_{t-1} with ``output_gate``, else None.
        x: ``[B, n, M]`` the projected input rows.
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
        if z_in is None:  # the input rows were updated by the previous block
            z = _qkv(torch.cat([rows_mem, rows_in], dim=1), block)  # [B, N+n, Q]
        else:
            z = torch.cat([_qkv(rows_mem, block), z_in], dim=1)  # [B, N+n, Q]
        full = spec.query_all and index < last  # blocks before the last update the input rows
        # E4: the last block (and every block with query_rows='memory') updates memory rows only
        residual = torch.cat([rows_mem, rows_in], dim=1) if full else rows_mem  # [B, R_q, M]
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
    recurrent = hidden if spec.output_gate else torch.tanh(memory)
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
    """Input-only work for every step, computed in batched GEMMs (E1–E3)."""

    x: Tensor  # [T, B, n, M]
    z_inputs: tuple[Tensor | None, ...]  # per block [T, B, n, Q] or None
    gate_x: Tensor | None  # [T, B, W]


def _hoist(cell: RelationalMemoryCell, weights: _Weights, rows: Tensor) -> _Hoisted:
    """E1 (projection), E2 (input-gate term), E3 (input-row qkv+LN where exact).

    Args:
        rows: ``[..., n, F]`` inputs of any leading shape (``[T, B]`` or ``[B]``).
    """
    cfg = cell.config
    x = cell.input_projection(rows)  # [..., n, M]
    if cfg.query_rows == "memory":  # input rows never change: every block's qkv is hoistable
        z_inputs = tuple(_qkv(x, block) for block in weights.blocks)
    else:  # only block 1 sees the raw x
        z_inputs = (_qkv(x, weights.blocks[0]),) + (None,) * (len(weights.blocks) - 1)
    gate_x = None
    if cfg.gate_style is not None:
        assert cell.input_gate is not None and weights.gate_bias is not None
        gate_x = F.linear(x.flatten(-2), cell.input_gate.weight, weights.gate_bias)  # [..., W]
    return _Hoisted(x, z_inputs, gate_x)


def deferral_pays(weight_shape: tuple[int, int], rows_per_step: int, device: torch.device) -> bool:
    """Whether E10 is expected to be faster for one in-loop weight (the ``'auto'`` rule).

    On a GPU the eager step is launch-bound, and E10 removes two kernels per weight per step
    (the small dW GEMM and its accumulation): it always pays. On a CPU it trades memory traffic:
    the bank concatenates ``rows · (in + out)`` floats per step, while per-step gradients
    accumulate an ``in · out`` product per step. Deferral pays when the bank is the smaller,
    ``rows · (in + out) < in · out``, i.e. when few rows (small batch, one slot) meet a large
    weight. Measured with one thread on the 2-core CPU VM (fwd+bwd ms, deferred / per step):
    small core 244 / 220 (128 rows, 384 × 128 qkv: no deferral), nth_farthest 334 / 281 (512
    rows: no deferral), LTE at batch 8 628 / 669 (32 rows: deferral) and the WikiText-2 core
    4031 / 4484 (64 rows, 1280 × 768 qkv: deferral).

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


def _defer_weight_grads(weights: _Weights, rows_per_step: int | None = None) -> _Weights:
    """Route in-loop weights through one :class:`_SequenceWeight` per tensor (E10).

    A weight shared by several blocks (the shared MLP) gets one bank, so its gradient is still
    one GEMM. Weights that need no gradient are left as they are.

    Args:
        weights: from :func:`_gather_weights`.
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
        block._replace(
            qkv_w=bank(block.qkv_w), mlp=tuple((bank(w), b) for w, b in block.mlp)
        )
        for block in weights.blocks
    )
    gate_w = None if weights.gate_w is None else bank(weights.gate_w)
    return weights._replace(blocks=blocks, gate_w=gate_w)


def fast_cell_step(
    cell: RelationalMemoryCell, rows: Tensor, state: RMCState
) -> tuple[Tensor, RMCState]:
    """One step, equal to :meth:`RelationalMemoryCell.step` without its details.

    Args:
        cell: the cell whose parameters to use.
        rows: ``[B, n, F]`` the validated step input.
        state: validated :class:`RMCState`.

    Returns:
        ``(output [B, N·M], new state)``.
    """
    from relmem.cores.rmc import RMCState

    weights = _gather_weights(cell)
    hoisted = _hoist(cell, weights, rows)
    memory, hidden = _step(
        _step_spec(cell.config),
        weights,
        state.memory,
        state.hidden,
        hoisted.x,
        hoisted.z_inputs,
        hoisted.gate_x,
    )
    output = (memory if hidden is None else hidden).flatten(1)
    return output, RMCState(memory, hidden)


StepFn = Callable[..., tuple[Tensor, "Tensor | None"]]


def fast_sequence(
    cell: RelationalMemoryCell,
    rows: Tensor,
    state: RMCState,
    lengths: Tensor | None,
    step_fn: StepFn = _step,
    defer_weight_grads: bool | None = None,
) -> tuple[Tensor, RMCState]:
    """The whole sequence, equal to ``run_cell_loop`` over :meth:`RelationalMemoryCell.step`.

    Args:
        cell: the cell whose parameters to use.
        rows: ``[T, B, n, F]`` the validated, time-major input.
        state: validated initial :class:`RMCState` (``memory [B, N, M]``).
        lengths: optional ``[B]`` int64 valid lengths in ``0..T``.
        step_fn: the recurrent step (:func:`_step`, or a compiled version of it).
        defer_weight_grads: E10: compute an in-loop weight's gradient once per sequence, as
            one GEMM over all T·B rows, instead of one small GEMM per step. None (default):
            for the weights where :func:`deferral_pays`; True: for every weight; False: never.
            Only with grad mode on and autocast off; :class:`FastRelationalMemory` turns it off
            for its compiled and graphed runs.

    Returns:
        ``(outputs [T, B, N·M], final state)``; outputs past an example's length are zero and
        its final state is the one after its last valid step.
    """
    from relmem.cores.rmc import RMCState

    spec = _step_spec(cell.config)
    weights = _gather_weights(cell)
    hoisted = _hoist(cell, weights, rows)
    # Autocast would hand the deferred linears mixed dtypes; E10 is for full-precision runs.
    autocast = torch.is_autocast_enabled(rows.device.type)
    if defer_weight_grads is not False and torch.is_grad_enabled() and not autocast:
        if defer_weight_grads is None:  # only the weights for which deferral pays
            batch, rows_in = rows.shape[1], rows.shape[2]
            updates_input_rows = spec.query_all and len(weights.blocks) > 1
            rows_per_step = batch * (spec.slots + (rows_in if updates_input_rows else 0))
            weights = _defer_weight_grads(weights, rows_per_step)
        else:
            weights = _defer_weight_grads(weights)
    memory, hidden = state.memory, state.hidden
    memories, hiddens = [], []
    # unbind, not indexing: the backward of x[t] would zero-fill a [T, ...] buffer per step
    # (quadratic in T); unbind's backward stacks the T slices' gradients once.
    steps = rows.shape[0]
    xs = hoisted.x.unbind(0)
    zs = [(None,) * steps if z is None else z.unbind(0) for z in hoisted.z_inputs]
    gates = (None,) * steps if hoisted.gate_x is None else hoisted.gate_x.unbind(0)
    for t in range(steps):
        z_t = tuple(z[t] for z in zs)
        memory, hidden = step_fn(spec, weights, memory, hidden, xs[t], z_t, gates[t])
        memories.append(memory)
        if hidden is not None:
            hiddens.append(hidden)
    stacked_m = torch.stack(memories)  # [T, B, N, M]; E12: the outputs are these memories
    stacked_h = torch.stack(hiddens) if hiddens else None
    shown = stacked_m if stacked_h is None else stacked_h
    outputs = shown.flatten(2)  # [T, B, N·M]
    if lengths is None:
        final_h = None if stacked_h is None else stacked_h[-1]
        return outputs, RMCState(stacked_m[-1], final_h)
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


class _GraphedSequence(nn.Module):
    """``(rows, memory[, hidden]) -> (outputs, memory[, hidden])`` for graph capture."""

    def __init__(self, core: FastRelationalMemory) -> None:
        super().__init__()
        self.core = core

    def forward(self, rows: Tensor, memory: Tensor, *hidden: Tensor) -> tuple[Tensor, ...]:
        from relmem.cores.rmc import RMCState

        state = RMCState(memory, hidden[0] if hidden else None)
        outputs, final = self.core.run(rows, state, None)
        return (outputs, final.memory) if final.hidden is None else (outputs, *final)


class FastRelationalMemory(nn.Module):
    """A :class:`RelationalMemory` run through the fast path with opt-in accelerations.

    It shares the wrapped core's parameters (``state_dict`` keys gain a ``core.`` prefix) and
    accepts the same ``forward`` arguments.

    Args:
        core: the module whose parameters to use.
        compile: ``torch.compile`` the recurrent step (the hoisted GEMMs stay eager). Exact up
            to float rounding.
        cuda_graph: on CUDA, capture the whole sequence, forward and backward, in CUDA graphs
            per input shape (``torch.cuda.make_graphed_callables``). Used only for calls
            with grad mode on and without ``lengths``; other calls run uncaptured. Parameters
            must not be replaced (in-place optimizer updates are fine), and the returned
            tensors live in the graph's static buffers: the next call of the same shape
            overwrites them, so clone what must outlive it.
        matmul_dtype: None (the parameters' dtype) or ``torch.bfloat16``/``torch.float16``:
            autocast the matmuls; LayerNorm statistics, softmax and the recurrent state stay
            fp32. Not exact (spec section 10): tests use bf16 tolerances.
        defer_weight_grads: E10 for the eager path (see :func:`fast_sequence`): None (where
            :func:`deferral_pays`), True (every in-loop weight) or False (none). Compiled and
            graph-captured runs never defer, so True is refused with them.

    Shapes: as :class:`RelationalMemory`.
    """

    def __init__(
        self,
        core: RelationalMemory,
        *,
        compile: bool = False,
        cuda_graph: bool = False,
        matmul_dtype: torch.dtype | None = None,
        defer_weight_grads: bool | None = None,
    ) -> None:
        super().__init__()
        if matmul_dtype not in (None, torch.bfloat16, torch.float16):
            raise ValueError(
                f"FastRelationalMemory: matmul_dtype must be None, torch.bfloat16 or "
                f"torch.float16, got {matmul_dtype!r}"
            )
        if defer_weight_grads not in (None, True, False):
            raise ValueError(
                f"FastRelationalMemory: defer_weight_grads must be None, True or False, got "
                f"{defer_weight_grads!r}"
            )
        if defer_weight_grads and (compile or cuda_graph):
            raise ValueError(
                "FastRelationalMemory: defer_weight_grads=True cannot be combined with "
                "compile=True or cuda_graph=True (its gradient bank lives in Python, outside "
                "a compiled or captured step); leave it None"
            )
        self.core = core
        self.compile = compile
        self.cuda_graph = cuda_graph
        self.matmul_dtype = matmul_dtype
        self.defer_weight_grads = False if (compile or cuda_graph) else defer_weight_grads
        self._step_fn: StepFn = torch.compile(_step, dynamic=False) if compile else _step
        self._graphs: dict[tuple[Any, ...], Callable[..., Any]] = {}

    @property
    def config(self) -> RMCConfig:
        return self.core.config

    def initial_state(self, batch_size: int, **kwargs: Any) -> RMCState:
        """See :meth:`RelationalMemoryCell.initial_state`."""
        return self.core.initial_state(batch_size, **kwargs)

    def _autocast(self, device: torch.device) -> Any:
        if self.matmul_dtype is None:
            return nullcontext()
        # cache_enabled=False: cached casts would be baked into a captured graph.
        return torch.autocast(device.type, dtype=self.matmul_dtype, cache_enabled=False)

    def run(
        self, rows: Tensor, state: RMCState, lengths: Tensor | None
    ) -> tuple[Tensor, RMCState]:
        """:func:`fast_sequence` with this wrapper's step and precision.

        Args:
            rows: ``[T, B, n, F]`` validated time-major input.
            state: validated initial state. lengths: optional ``[B]``.

        Returns:
            ``(outputs [T, B, N·M], final state)``, outputs and state in the parameters' dtype.
        """
        from relmem.cores.rmc import RMCState

        dtype = self.core.cell.input_projection.weight.dtype
        with self._autocast(rows.device):
            outputs, final = fast_sequence(
                self.core.cell, rows, state, lengths, self._step_fn,
                defer_weight_grads=self.defer_weight_grads,
            )
        outputs = outputs.to(dtype)
        final = RMCState(*(None if s is None else s.to(dtype) for s in final))
        return outputs, final

    def _graphed(self, rows: Tensor, state: RMCState) -> Callable[..., Any]:
        args = (rows, *(s for s in state if s is not None))
        key = (tuple(rows.shape), rows.dtype, rows.device, tuple(a.requires_grad for a in args))
        if key not in self._graphs:
            sample = tuple(a.detach().clone().requires_grad_(a.requires_grad) for a in args)
            self._graphs[key] = torch.cuda.make_graphed_callables(
                _GraphedSequence(self), sample, num_warmup_iters=3
            )
        return self._graphs[key]

    def forward(
        self,
        input: Any,
        state: RMCState | Tensor | None = None,
        *,
        lengths: Tensor | None = None,
    ) -> tuple[Any, RMCState]:
        """As :meth:`RelationalMemory.forward`."""
        from relmem.cores.base import finish_sequence
        from relmem.cores.rmc import RMCState

        core = self.core
        seq, rows, state = core.prepare(input, state, lengths)
        use_graph = (
            self.cuda_graph and rows.is_cuda and seq.lengths is None and torch.is_grad_enabled()
        )
        if use_graph:
            graphed = self._graphed(rows, state)
            result = graphed(rows, *(s for s in state if s is not None))
            outputs, final = result[0], RMCState(*result[1:])
        else:
            outputs, final = self.run(rows, state, seq.lengths)
        return finish_sequence(outputs, seq, core.batch_first), final
