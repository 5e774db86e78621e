"""DNC addressing: content weights, usage and allocation, the temporal link (``docs/dnc.md``).

Every function here is a pure tensor function with no parameters, so each can be checked
against hand-computed values and with ``torch.autograd.gradcheck``. They assume the caller has
already moved the maths to float32 or float64 (:class:`~relmem.cores.dnc.memory.DNCMemory`
does this, also under autocast): the ε of 1e-6 is below fp16's normal range.

Notation: B batch, N memory slots, W word size, R read heads, Wh write heads, H any number of
heads (keys) looked up at once, K the row budget of the sparse link.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

EPSILON = 1e-6
"""ε of the cosine norms, the cosine denominator and the usage clamp (``docs/dnc.md`` §4 and §6)."""


def oneplus(x: Tensor) -> Tensor:
    """``1 + log(1 + e^x)`` computed as ``1 + softplus(x)`` (stable for large ``|x|``); ≥ 1."""
    return 1.0 + F.softplus(x)


# ---------------------------------------------------------------- content (`docs/dnc.md` §4)


def cosine_similarity(memory: Tensor, keys: Tensor, eps: float = EPSILON) -> Tensor:
    """ε-guarded cosine similarity between every key and every memory row (``docs/dnc.md`` §4).

    ``S[h, i] = (k_h · M_i) / (‖k_h‖_ε ‖M_i‖_ε + ε)`` with ``‖v‖_ε = sqrt(Σ v² + ε)``, so all-zero
    memory or keys give S = 0 and finite gradients.

    Args:
        memory: ``[B, N, W]``.
        keys: ``[B, H, W]``.
        eps: ε, used inside the square roots and in the denominator.

    Returns:
        ``[B, H, N]`` similarities in (-1, 1).
    """
    dot = keys @ memory.transpose(-1, -2)  # [B, H, N]
    memory_norm = torch.sqrt(memory.square().sum(-1) + eps)  # [B, N]
    key_norm = torch.sqrt(keys.square().sum(-1) + eps)  # [B, H]
    return dot / (key_norm.unsqueeze(-1) * memory_norm.unsqueeze(-2) + eps)


def content_weights(
    memory: Tensor, keys: Tensor, strengths: Tensor, eps: float = EPSILON
) -> Tensor:
    """Content addressing ``C(M, k, β) = softmax_i(β · S[:, i])`` (``docs/dnc.md`` §4).

    Args:
        memory: ``[B, N, W]``.
        keys: ``[B, H, W]``.
        strengths: ``[B, H]`` β, already squashed (oneplus, or softplus with deepmind compat).
        eps: see :func:`cosine_similarity`.

    Returns:
        ``[B, H, N]`` weights; every row sums to 1.
    """
    similarity = cosine_similarity(memory, keys, eps)  # [B, H, N]
    return torch.softmax(strengths.unsqueeze(-1) * similarity, dim=-1)


# ---------------------------------------------------------------- usage (`docs/dnc.md` §5)


def retention(free_gates: Tensor, prev_read_weights: Tensor) -> Tensor:
    """The retention vector ``ψ = Π_i (1 − f_i w^r_{t−1,i})`` (``docs/dnc.md`` §5).

    Args:
        free_gates: ``[B, R]`` current free gates in [0, 1].
        prev_read_weights: ``[B, R, N]`` the previous step's read weights.

    Returns:
        ``[B, N]`` in [0, 1]. ``torch.prod`` has a zero-safe backward, so a factor of exactly 0
        (a full free) still gives correct gradients for the other heads.
    """
    return torch.prod(1.0 - free_gates.unsqueeze(-1) * prev_read_weights, dim=1)


def update_usage(
    usage: Tensor,
    prev_write_weights: Tensor,
    retention_vector: Tensor,
    *,
    write_grad: bool = False,
) -> Tensor:
    """``u_t = (u + ŵ − u ∘ ŵ) ∘ ψ`` with ``ŵ = 1 − Π_j (1 − w^w_{t−1,j})`` (``docs/dnc.md`` §5).

    Args:
        usage: ``[B, N]`` ``u_{t−1}`` in [0, 1].
        prev_write_weights: ``[B, Wh, N]`` ``w^w_{t−1}``.
        retention_vector: ``[B, N]`` ψ from :func:`retention`.
        write_grad: let gradients flow into ``w^w_{t−1}``; by default they are stopped, as in
            ``deepmind/dnc`` ("usage is not differentiable with respect to write weights").

    Returns:
        ``[B, N]`` ``u_t``, in [0, 1] (clamped against rounding).
    """
    if not write_grad:
        prev_write_weights = prev_write_weights.detach()
    written = 1.0 - torch.prod(1.0 - prev_write_weights, dim=1)  # [B, N]
    usage = (usage + written - usage * written) * retention_vector
    return usage.clamp(0.0, 1.0)


# ---------------------------------------------------------------- allocation (`docs/dnc.md` §6)


def allocation_weights(usage: Tensor, eps: float = EPSILON) -> Tensor:
    """Dynamic allocation ``a(u)`` (``docs/dnc.md`` §6): free slots first, least used first.

    ``û = ε + (1−ε) u``; φ sorts û ascending (stable: ties go to the lower slot index);
    ``a[φ_j] = (1 − û[φ_j]) Π_{i<j} û[φ_i]``. The gradient flows through the sorted values; the
    permutation is treated as a constant, as in the paper.

    Args:
        usage: ``[B, N]`` in [0, 1].
        eps: ε of the usage clamp, which keeps the cumulative product away from exact 0 and 1.

    Returns:
        ``[B, N]`` allocation weights; they sum to ``1 − Π û`` (≈ 1 when a slot is free).
    """
    clamped = eps + (1.0 - eps) * usage  # [B, N]
    sorted_usage, order = torch.sort(clamped, dim=-1, stable=True)  # ascending
    ones = torch.ones_like(sorted_usage[..., :1])
    exclusive = torch.cumprod(torch.cat([ones, sorted_usage[..., :-1]], dim=-1), dim=-1)
    sorted_allocation = (1.0 - sorted_usage) * exclusive  # [B, N] in sorted order
    return torch.zeros_like(sorted_allocation).scatter(-1, order, sorted_allocation)


def write_allocation_weights(usage: Tensor, gates: Tensor, eps: float = EPSILON) -> Tensor:
    """Allocation for several write heads by simulated usage (``deepmind/dnc``, ``docs/dnc.md`` §6).

    For j = 1..Wh: ``a_j = a(u)``, then ``u ← u + (1 − u) ∘ gates_j ∘ a_j``. The simulated usage
    is local to this call.

    Args:
        usage: ``[B, N]`` ``u_t``.
        gates: ``[B, Wh]`` the product of allocation and write gates of each write head.
        eps: see :func:`allocation_weights`.

    Returns:
        ``[B, Wh, N]``.
    """
    weights = []
    for head in range(gates.shape[1]):
        allocation = allocation_weights(usage, eps)  # [B, N]
        weights.append(allocation)
        usage = usage + (1.0 - usage) * gates[:, head : head + 1] * allocation
    return torch.stack(weights, dim=1)


# ---------------------------------------------------------------- write (`docs/dnc.md` §7)


def write_memory(
    memory: Tensor, write_weights: Tensor, erase_vectors: Tensor, write_vectors: Tensor
) -> Tensor:
    """``M_t = M_{t−1} ∘ Π_j (1 − w_j e_jᵀ) + Σ_j w_j v_jᵀ`` (``docs/dnc.md`` §7).

    Args:
        memory: ``[B, N, W]`` ``M_{t−1}``.
        write_weights: ``[B, Wh, N]``.
        erase_vectors: ``[B, Wh, W]`` in [0, 1].
        write_vectors: ``[B, Wh, W]``.

    Returns:
        ``[B, N, W]``.
    """
    erase = write_weights.unsqueeze(-1) * erase_vectors.unsqueeze(-2)  # [B, Wh, N, W]
    keep = torch.prod(1.0 - erase, dim=1)  # [B, N, W]
    add = write_weights.transpose(1, 2) @ write_vectors  # [B, N, Wh] @ [B, Wh, W] -> [B, N, W]
    return memory * keep + add


# ---------------------------------------------------------------- link (`docs/dnc.md` §8)


def update_link(link: Tensor, precedence: Tensor, write_weights: Tensor) -> Tensor:
    """Dense temporal link update (``docs/dnc.md`` §8), one matrix per write head.

    ``L[i, k] ← (1 − w[i] − w[k]) L[i, k] + w[i] p[k]``, then ``L[i, i] = 0``.

    Args:
        link: ``[B, Wh, N, N]`` ``L_{t−1}``.
        precedence: ``[B, Wh, N]`` ``p_{t−1}`` (the link uses the previous precedence).
        write_weights: ``[B, Wh, N]`` ``w^w_t``.

    Returns:
        ``[B, Wh, N, N]`` ``L_t`` with a zero diagonal, entries in [0, 1].
    """
    w_row = write_weights.unsqueeze(-1)  # [B, Wh, N, 1]
    w_col = write_weights.unsqueeze(-2)  # [B, Wh, 1, N]
    new_link = (1.0 - w_row - w_col) * link + w_row * precedence.unsqueeze(-2)
    num_slots = link.shape[-1]
    diagonal = torch.eye(num_slots, dtype=torch.bool, device=link.device)  # built on the fly
    return new_link.masked_fill(diagonal, 0.0)


def update_precedence(precedence: Tensor, write_weights: Tensor) -> Tensor:
    """``p_t = (1 − Σ_i w[i]) p_{t−1} + w`` (``docs/dnc.md`` §8).

    Args:
        precedence: ``[B, Wh, N]``.
        write_weights: ``[B, Wh, N]``.

    Returns:
        ``[B, Wh, N]``; each row sums to at most 1.
    """
    return (1.0 - write_weights.sum(-1, keepdim=True)) * precedence + write_weights


def directional_weights(link: Tensor, prev_read_weights: Tensor) -> tuple[Tensor, Tensor]:
    """Backward and forward weightings through a dense link (``docs/dnc.md`` §8).

    ``f = L w^r_{t−1}`` (``f[i] = Σ_k L[i, k] w[k]``) and ``b = Lᵀ w^r_{t−1}``.

    Args:
        link: ``[B, Wh, N, N]`` ``L_t``.
        prev_read_weights: ``[B, R, N]`` ``w^r_{t−1}``.

    Returns:
        ``(backward, forward)``, each ``[B, R, Wh, N]``.
    """
    reads = prev_read_weights.unsqueeze(1)  # [B, 1, R, N]
    backward = reads @ link  # [B, Wh, R, N]: Σ_i w[i] L[i, k]
    forward = reads @ link.transpose(-1, -2)  # [B, Wh, R, N]: Σ_k L[i, k] w[k]
    return backward.transpose(1, 2), forward.transpose(1, 2)


# ---------------------------------------------------------------------- sparse link


def initial_sparse_link_index(
    batch_size: int, num_writes: int, num_slots: int, k: int, device: torch.device | None = None
) -> Tensor:
    """The column indices of an empty sparse link: every row starts with columns ``0..K−1``.

    Returns:
        ``[B, Wh, N, K]`` int64. With K = N each row holds every column exactly once.
    """
    index = torch.arange(k, device=device)
    return index.expand(batch_size, num_writes, num_slots, k).clone()


def update_sparse_link(
    values: Tensor, index: Tensor, precedence: Tensor, write_weights: Tensor
) -> tuple[Tensor, Tensor]:
    """Sparse temporal link update: the dense rule with each row truncated to its top K.

    Each row i of ``L`` is stored as K (column, value) pairs with distinct columns. The update
    applies the dense rule to the stored entries, adds the new entries ``w[i] p[k]`` for the K
    columns k where ``p_{t−1}`` is largest (merged into an existing entry when the column is
    already stored), zeroes the diagonal, and keeps the K largest values of each row. State and
    work are O(B·Wh·N·K): linear in N. Truncation only removes non-negative entries, so the row
    and column sums stay ≤ 1. With K = N nothing is truncated and the result equals
    :func:`update_link` exactly. This is the paper's sparse link (Methods, "Sparse link
    matrix") with the write weights kept dense; the paper also truncates ``w`` to K entries.

    Args:
        values: ``[B, Wh, N, K]`` stored values of ``L_{t−1}``.
        index: ``[B, Wh, N, K]`` int64 column of each value, distinct within a row.
        precedence: ``[B, Wh, N]`` ``p_{t−1}``.
        write_weights: ``[B, Wh, N]`` ``w^w_t``.

    Returns:
        ``(values, index)`` of ``L_t``, same shapes.
    """
    k = values.shape[-1]
    num_slots = values.shape[-2]
    w_row = write_weights.unsqueeze(-1)  # [B, Wh, N, 1]
    w_col = torch.gather(write_weights, -1, index.flatten(-2)).view_as(values)  # w[index[i, c]]
    kept = (1.0 - w_row - w_col) * values  # [B, Wh, N, K]

    top_p, top_index = torch.topk(precedence, k, dim=-1)  # [B, Wh, K]
    new_index = top_index.unsqueeze(-2).expand_as(index)  # [B, Wh, N, K]
    new_values = w_row * top_p.unsqueeze(-2)  # [B, Wh, N, K]
    same = new_index.unsqueeze(-1) == index.unsqueeze(-2)  # [B, Wh, N, K_new, K_old]
    kept = kept + (same * new_values.unsqueeze(-1)).sum(-2)  # merge into stored columns
    duplicate = same.any(-1)  # [B, Wh, N, K_new]

    cand_values = torch.cat([kept, new_values.masked_fill(duplicate, 0.0)], dim=-1)
    cand_index = torch.cat([index, new_index], dim=-1)  # [B, Wh, N, 2K]
    rows = torch.arange(num_slots, device=index.device).view(num_slots, 1)
    cand_values = cand_values.masked_fill(cand_index == rows, 0.0)  # zero diagonal
    # Duplicates must never be chosen (their column is already among the stored ones); rank
    # them below every real candidate, which are all ≥ 0.
    priority = cand_values.detach().masked_fill(
        torch.cat([torch.zeros_like(duplicate), duplicate], dim=-1), -1.0
    )
    choice = torch.topk(priority, k, dim=-1).indices  # [B, Wh, N, K]
    return torch.gather(cand_values, -1, choice), torch.gather(cand_index, -1, choice)


def sparse_directional_weights(
    values: Tensor, index: Tensor, prev_read_weights: Tensor
) -> tuple[Tensor, Tensor]:
    """:func:`directional_weights` for a sparse link stored as (values, index) rows.

    Args:
        values: ``[B, Wh, N, K]``.
        index: ``[B, Wh, N, K]`` int64.
        prev_read_weights: ``[B, R, N]``.

    Returns:
        ``(backward, forward)``, each ``[B, R, Wh, N]``.
    """
    batch, num_writes, num_slots, k = values.shape
    num_reads = prev_read_weights.shape[1]
    shape = (batch, num_reads, num_writes, num_slots, k)
    vals = values.unsqueeze(1)  # [B, 1, Wh, N, K]
    cols = index.unsqueeze(1).expand(shape).reshape(batch, num_reads, -1)  # [B, R, Wh·N·K]
    # forward f[i] = Σ_c L[i, col_c] w[col_c]; gathering from [B, R, N] keeps the backward linear
    gathered = torch.gather(prev_read_weights, -1, cols).view(shape)  # [B, R, Wh, N, K]
    forward = (vals * gathered).sum(-1)  # [B, R, Wh, N]
    # backward b[k] = Σ_i w[i] L[i, k]: scatter each row's contributions to its columns
    reads = prev_read_weights.view(batch, num_reads, 1, num_slots, 1)
    contributions = (vals * reads).reshape(batch, num_reads, num_writes, -1)  # [B, R, Wh, N·K]
    backward = torch.zeros(
        batch, num_reads, num_writes, num_slots, dtype=values.dtype, device=values.device
    ).scatter_add(-1, index.flatten(-2).unsqueeze(1).expand_as(contributions), contributions)
    return backward, forward


def sparse_link_to_dense(values: Tensor, index: Tensor) -> Tensor:
    """Expand a sparse link ``[B, Wh, N, K]`` (values, index) to the dense ``[B, Wh, N, N]``."""
    dense = values.new_zeros(*values.shape[:-1], values.shape[-2])
    return dense.scatter_add(-1, index, values)


def sharpen(weights: Tensor, sharpness: Tensor, eps: float = EPSILON) -> Tensor:
    """Link sharpening ``d^s / (Σ d^s + ε)`` over the last axis (``RobertCsordas/dnc``).

    Zero entries stay zero with finite gradients (no ``0^s · log 0``).

    Args:
        weights: ``[..., N]`` non-negative forward or backward weights.
        sharpness: broadcastable to ``weights`` without the last axis plus a trailing 1, s ≥ 1.
        eps: guards the normalisation of an all-zero distribution.

    Returns:
        Same shape as ``weights``.
    """
    positive = weights > 0
    safe = torch.where(positive, weights, torch.ones_like(weights))
    powered = torch.where(positive, safe**sharpness, torch.zeros_like(weights))
    return powered / (powered.sum(-1, keepdim=True) + eps)
