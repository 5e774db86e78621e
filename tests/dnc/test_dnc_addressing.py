"""The pure addressing functions against hand-computed values, properties and gradcheck.

Ports the assertions of ``deepmind/dnc`` ``addressing_test.py`` (``docs/dnc.md`` §16.1–§16.2).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.autograd import gradcheck

from relmem.cores.dnc import addressing as A

f64 = torch.float64


def rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed), dtype=f64)


# ---------------------------------------------------------------------- content


def test_oneplus_values_and_stability():
    x = torch.tensor([-1000.0, 0.0, 1000.0], dtype=f64)
    expected = torch.tensor([1.0, 1.0 + math.log(2.0), 1001.0], dtype=f64)
    torch.testing.assert_close(A.oneplus(x), expected)
    assert torch.all(A.oneplus(torch.randn(100)) >= 1.0)


def test_cosine_hand_computed():
    memory = torch.tensor([[[1.0, 0.0], [0.0, 2.0], [3.0, 4.0]]], dtype=f64)  # [1, 3, 2]
    keys = torch.tensor([[[1.0, 1.0]]], dtype=f64)  # [1, 1, 2]
    eps = 1e-6
    k = math.sqrt(2 + eps)
    expected = [
        1.0 / (k * math.sqrt(1 + eps) + eps),
        2.0 / (k * math.sqrt(4 + eps) + eps),
        7.0 / (k * math.sqrt(25 + eps) + eps),
    ]
    got = A.cosine_similarity(memory, keys, eps)
    torch.testing.assert_close(got, torch.tensor([[expected]], dtype=f64))
    # ≈ the exact cosine 1/√2, 1/√2, 7/(5√2)
    torch.testing.assert_close(
        got, torch.tensor([[[2**-0.5, 2**-0.5, 7 / (5 * 2**0.5)]]], dtype=f64), atol=1e-5, rtol=0
    )


def test_content_weights_hand_computed():
    memory = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]], dtype=f64)
    keys = torch.tensor([[[1.0, 0.0]]], dtype=f64)
    strengths = torch.tensor([[2.0]], dtype=f64)
    sim = 1.0 / (math.sqrt(1 + 1e-6) ** 2 + 1e-6)
    expected = torch.softmax(torch.tensor([2 * sim, 0.0], dtype=f64), 0)
    torch.testing.assert_close(A.content_weights(memory, keys, strengths)[0, 0], expected)


def test_content_zero_memory_is_uniform_with_finite_gradients():
    memory = torch.zeros(2, 5, 3, dtype=f64, requires_grad=True)
    keys = torch.zeros(2, 2, 3, dtype=f64, requires_grad=True)
    strengths = torch.full((2, 2), 1e4, dtype=f64, requires_grad=True)
    weights = A.content_weights(memory, keys, strengths)
    torch.testing.assert_close(weights, torch.full_like(weights, 0.2))
    (weights * rand(2, 2, 5)).sum().backward()
    for tensor in (memory, keys, strengths):
        assert torch.isfinite(tensor.grad).all()


def test_content_gradients_finite_with_one_nonzero_row():
    memory = torch.zeros(1, 4, 3, dtype=f64)
    memory[0, 2] = torch.tensor([0.5, -1.0, 2.0])
    memory.requires_grad_(True)
    keys = torch.randn(1, 2, 3, dtype=f64, requires_grad=True)
    strengths = torch.tensor([[1.0, 50.0]], dtype=f64, requires_grad=True)
    A.content_weights(memory, keys, strengths).pow(2).sum().backward()
    for tensor in (memory, keys, strengths):
        assert torch.isfinite(tensor.grad).all()
    assert gradcheck(A.content_weights, (memory, keys, strengths))


def test_content_gradcheck():
    memory = torch.randn(2, 4, 3, dtype=f64, requires_grad=True)
    keys = torch.randn(2, 2, 3, dtype=f64, requires_grad=True)
    strengths = (1 + rand(2, 2) * 3).requires_grad_(True)
    assert gradcheck(A.content_weights, (memory, keys, strengths))


# ---------------------------------------------------------------------- usage


def test_usage_full_write_and_full_free():
    usage = torch.tensor([[0.2, 0.5, 0.0]], dtype=f64)
    write = torch.tensor([[[0.0, 0.0, 1.0]]], dtype=f64)  # full write to slot 2
    no_free = torch.ones(1, 3, dtype=f64)
    got = A.update_usage(usage, write, no_free)
    torch.testing.assert_close(got, torch.tensor([[0.2, 0.5, 1.0]], dtype=f64))
    # full free of slot 1 by one read head: ψ[1] = 1 − 1·1 = 0
    reads = torch.tensor([[[0.0, 1.0, 0.0], [0.3, 0.3, 0.4]]], dtype=f64)
    free_gates = torch.tensor([[1.0, 0.0]], dtype=f64)
    psi = A.retention(free_gates, reads)
    torch.testing.assert_close(psi, torch.tensor([[1.0, 0.0, 1.0]], dtype=f64))
    got = A.update_usage(usage, torch.zeros_like(write), psi)
    torch.testing.assert_close(got, torch.tensor([[0.2, 0.0, 0.0]], dtype=f64))


def test_usage_hand_computed_and_bounded():
    # u = (u + w − u∘w)∘ψ, ψ = Π(1 − f w^r)
    usage = torch.tensor([[0.5, 0.1]], dtype=f64)
    write = torch.tensor([[[0.5, 0.2]]], dtype=f64)
    reads = torch.tensor([[[0.4, 0.6], [1.0, 0.0]]], dtype=f64)
    free = torch.tensor([[0.5, 0.25]], dtype=f64)
    psi = A.retention(free, reads)
    expected_psi = torch.tensor([[(1 - 0.2) * (1 - 0.25), (1 - 0.3) * 1.0]], dtype=f64)
    torch.testing.assert_close(psi, expected_psi)
    got = A.update_usage(usage, write, psi)
    expected = torch.tensor([[(0.5 + 0.5 - 0.25) * 0.6, (0.1 + 0.2 - 0.02) * 0.7]], dtype=f64)
    torch.testing.assert_close(got, expected)
    for seed in range(5):
        u = A.update_usage(rand(3, 6, seed=seed), rand(3, 2, 6, seed=seed + 10) / 3, rand(3, 6))
        assert (u >= 0).all() and (u <= 1).all()


def test_usage_stops_gradient_through_previous_write_weights():
    write = (rand(1, 1, 4) / 4).requires_grad_(True)
    usage = rand(1, 4, seed=1).requires_grad_(True)
    free = rand(1, 2, seed=2).requires_grad_(True)
    reads = (rand(1, 2, 4, seed=3) / 4).requires_grad_(True)
    A.update_usage(usage, write, A.retention(free, reads)).sum().backward()
    assert write.grad is None
    for tensor in (usage, free, reads):
        assert tensor.grad is not None and tensor.grad.abs().sum() > 0
    A.update_usage(usage, write, A.retention(free, reads), write_grad=True).sum().backward()
    assert write.grad is not None and write.grad.abs().sum() > 0


def test_retention_zero_factor_has_correct_gradient():
    # Head 0 frees slot 0 completely; the gradient to head 1's gate must still be −Π_{others}.
    free = torch.tensor([[1.0, 0.5]], dtype=f64, requires_grad=True)
    reads = torch.tensor([[[1.0, 0.0], [0.5, 0.5]]], dtype=f64)
    A.retention(free, reads)[0, 0].backward()
    torch.testing.assert_close(free.grad, torch.tensor([[-0.75, 0.0]], dtype=f64))


# ---------------------------------------------------------------------- allocation


def test_allocation_hand_computed():
    eps = 1e-6
    usage = torch.tensor([[0.5, 0.0, 1.0, 0.25]], dtype=f64)
    u = eps + (1 - eps) * usage[0]
    # ascending order: slot 1, 3, 0, 2
    expected = torch.zeros(4, dtype=f64)
    expected[1] = 1 - u[1]
    expected[3] = (1 - u[3]) * u[1]
    expected[0] = (1 - u[0]) * u[1] * u[3]
    expected[2] = (1 - u[2]) * u[1] * u[3] * u[0]
    torch.testing.assert_close(A.allocation_weights(usage)[0], expected)


def test_allocation_picks_least_used_free_slots_first():
    usage = torch.tensor([[0.9, 0.3, 0.0, 0.6, 1.0]])
    alloc = A.allocation_weights(usage)
    assert alloc.argmax(-1).item() == 2  # the free slot
    # with one slot freed the allocation is one-hot on it
    torch.testing.assert_close(alloc, torch.tensor([[0.0, 0.0, 1.0, 0.0, 0.0]]), atol=1e-5, rtol=0)
    # with no free slot the least used one gets the largest weight, then the next, ...
    usage = torch.tensor([[0.9, 0.3, 0.95, 0.6, 0.99]])
    alloc = A.allocation_weights(usage)[0]
    assert alloc.argsort(descending=True).tolist() == [1, 3, 0, 2, 4]
    for seed in range(5):
        usage = rand(4, 7, seed=seed)
        alloc = A.allocation_weights(usage)
        assert torch.equal(alloc.argmax(-1), usage.argmin(-1))
        # Σ a = 1 − Π û
        clamped = 1e-6 + (1 - 1e-6) * usage
        torch.testing.assert_close(alloc.sum(-1), 1 - clamped.prod(-1))


def test_allocation_ties_go_to_lower_index_and_sum_to_one():
    alloc = A.allocation_weights(torch.zeros(2, 6))
    torch.testing.assert_close(alloc[:, 0], torch.ones(2), atol=1e-5, rtol=0)
    usage = torch.tensor([[1.0, 0.2, 0.2, 1.0]])
    assert A.allocation_weights(usage).argmax().item() == 1
    usage = torch.rand(8, 10) * 0.5
    sums = A.allocation_weights(usage).sum(-1)
    torch.testing.assert_close(sums, torch.ones(8), atol=0.01, rtol=0)


def test_allocation_all_slots_used_is_finite():
    usage = torch.ones(2, 5, requires_grad=True)
    alloc = A.allocation_weights(usage)
    assert torch.isfinite(alloc).all() and alloc.sum() < 1e-5
    alloc.sum().backward()
    assert torch.isfinite(usage.grad).all()


def test_allocation_gradcheck():
    # distinct usages (no ties): the sort permutation is locally constant
    usage = torch.tensor([[0.1, 0.7, 0.35, 0.9, 0.55]], dtype=f64, requires_grad=True)
    assert gradcheck(A.allocation_weights, (usage,))
    assert gradcheck(A.allocation_weights, (torch.rand(3, 6, dtype=f64).requires_grad_(),))


def test_write_allocation_weights_several_heads():
    usage = torch.tensor([[0.9, 0.1, 0.5, 0.0]], dtype=f64)
    gates = torch.ones(1, 2, dtype=f64)
    alloc = A.write_allocation_weights(usage, gates)  # [1, 2, 4]
    assert alloc.shape == (1, 2, 4)
    # the first head takes the free slot 3, the second head the next least-used slot 1
    assert alloc[0, 0].argmax().item() == 3 and alloc[0, 1].argmax().item() == 1
    torch.testing.assert_close(alloc[:, 0], A.allocation_weights(usage))
    simulated = usage + (1 - usage) * alloc[:, 0]
    torch.testing.assert_close(alloc[:, 1], A.allocation_weights(simulated))
    # closed gates leave the simulated usage untouched
    closed = A.write_allocation_weights(usage, torch.zeros(1, 2, dtype=f64))
    torch.testing.assert_close(closed[:, 1], closed[:, 0])


def test_write_allocation_gradcheck():
    usage = torch.tensor([[0.1, 0.7, 0.35, 0.9, 0.55]], dtype=f64, requires_grad=True)
    gates = torch.tensor([[0.6, 0.3]], dtype=f64, requires_grad=True)
    assert gradcheck(A.write_allocation_weights, (usage, gates))


# ---------------------------------------------------------------------- write


def test_erase_write_hand_made():
    memory = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]], dtype=f64)
    w = torch.tensor([[[0.5, 0.0, 1.0]]], dtype=f64)
    e = torch.tensor([[[1.0, 0.5]]], dtype=f64)
    v = torch.tensor([[[10.0, -2.0]]], dtype=f64)
    # M ∘ (E − w eᵀ) + w vᵀ
    expected = torch.tensor(
        [[[1 * 0.5 + 5, 2 * 0.75 - 1], [3.0, 4.0], [5 * 0.0 + 10, 6 * 0.5 - 2]]], dtype=f64
    )
    torch.testing.assert_close(A.write_memory(memory, w, e, v), expected)


def test_erase_write_several_heads_multiply_erases_and_sum_writes():
    memory = rand(2, 4, 3)
    w = rand(2, 2, 4, seed=1) / 4
    e, v = rand(2, 2, 3, seed=2), torch.randn(2, 2, 3, dtype=f64)
    keep = (1 - w[:, 0, :, None] * e[:, 0, None]) * (1 - w[:, 1, :, None] * e[:, 1, None])
    add = w[:, 0, :, None] * v[:, 0, None] + w[:, 1, :, None] * v[:, 1, None]
    torch.testing.assert_close(A.write_memory(memory, w, e, v), memory * keep + add)
    args = tuple(t.requires_grad_(True) for t in (memory, w, e, v))
    assert gradcheck(A.write_memory, args)


# ---------------------------------------------------------------------- link and precedence


def random_write_weights(batch: int, heads: int, slots: int, seed: int) -> torch.Tensor:
    """Write weights with Σ ≤ 1 per head (a softmax times a gate)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, heads, slots, generator=g, dtype=f64) * 2
    gate = torch.rand(batch, heads, 1, generator=g, dtype=f64)
    return torch.softmax(logits, -1) * gate


def test_link_hand_computed():
    link = torch.zeros(1, 1, 3, 3, dtype=f64)
    link[0, 0, 1, 0] = 0.5
    precedence = torch.tensor([[[0.2, 0.3, 0.5]]], dtype=f64)
    w = torch.tensor([[[0.1, 0.6, 0.3]]], dtype=f64)
    got = A.update_link(link, precedence, w)[0, 0]
    expected = torch.zeros(3, 3, dtype=f64)
    for i in range(3):
        for k in range(3):
            if i != k:
                expected[i, k] = (1 - w[0, 0, i] - w[0, 0, k]) * link[0, 0, i, k] + w[
                    0, 0, i
                ] * precedence[0, 0, k]
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(A.update_precedence(precedence, w), (1 - 1.0) * precedence + w)


def test_link_properties_over_a_random_sequence():
    batch, heads, slots = 3, 2, 6
    link = torch.zeros(batch, heads, slots, slots, dtype=f64)
    precedence = torch.zeros(batch, heads, slots, dtype=f64)
    for t in range(12):
        w = random_write_weights(batch, heads, slots, seed=t)
        link = A.update_link(link, precedence, w)
        precedence = A.update_precedence(precedence, w)
        assert (link >= 0).all() and (link <= 1).all()
        assert (link.diagonal(dim1=-2, dim2=-1) == 0).all()
        assert (link.sum(-1) <= 1 + 1e-12).all() and (link.sum(-2) <= 1 + 1e-12).all()
        assert (precedence >= 0).all() and (precedence.sum(-1) <= 1 + 1e-12).all()


def test_link_one_hot_writes_give_exact_transitions():
    slots = 5
    link = torch.zeros(1, 1, slots, slots)
    precedence = torch.zeros(1, 1, slots)
    order = [2, 0, 4, 1]
    for slot in order:
        w = torch.zeros(1, 1, slots)
        w[0, 0, slot] = 1.0
        link = A.update_link(link, precedence, w)
        precedence = A.update_precedence(precedence, w)
        torch.testing.assert_close(precedence, w)  # a full write resets the precedence
    expected = torch.zeros(slots, slots)
    for before, after in zip(order, order[1:], strict=False):
        expected[after, before] = 1.0  # L[i, k]: i written right after k
    torch.testing.assert_close(link[0, 0], expected)
    # forward from a one-hot read at slot 0 goes to the slot written after it (4) ...
    read = torch.zeros(1, 1, slots)
    read[0, 0, 0] = 1.0
    backward, forward = A.directional_weights(link, read)
    assert forward.shape == (1, 1, 1, slots)
    assert forward[0, 0, 0].argmax().item() == 4 and forward[0, 0, 0].max() == 1.0
    # ... and backward to the one written before it (2)
    assert backward[0, 0, 0].argmax().item() == 2 and backward[0, 0, 0].max() == 1.0


def test_directional_weights_hand_computed():
    link = rand(2, 2, 4, 4)
    reads = rand(2, 3, 4, seed=1)
    backward, forward = A.directional_weights(link, reads)
    assert backward.shape == forward.shape == (2, 3, 2, 4)
    torch.testing.assert_close(forward, torch.einsum("bjik,brk->brji", link, reads))
    torch.testing.assert_close(backward, torch.einsum("bjik,bri->brjk", link, reads))


def test_precedence_hand_computed():
    p = torch.tensor([[[0.5, 0.5, 0.0]]], dtype=f64)
    w = torch.tensor([[[0.0, 0.2, 0.2]]], dtype=f64)
    torch.testing.assert_close(
        A.update_precedence(p, w), torch.tensor([[[0.3, 0.5, 0.2]]], dtype=f64)
    )


def test_link_and_precedence_gradcheck():
    link = (rand(1, 2, 4, 4) / 4).requires_grad_(True)
    precedence = (rand(1, 2, 4, seed=1) / 4).requires_grad_(True)
    w = random_write_weights(1, 2, 4, seed=2).requires_grad_(True)
    assert gradcheck(A.update_link, (link, precedence, w))
    assert gradcheck(A.update_precedence, (precedence, w))
    reads = rand(1, 3, 4, seed=3).requires_grad_(True)
    assert gradcheck(A.directional_weights, (link, reads))


# ---------------------------------------------------------------------- sparse link


def run_links(batch: int, heads: int, slots: int, k: int, steps: int):
    dense = torch.zeros(batch, heads, slots, slots, dtype=f64)
    values = torch.zeros(batch, heads, slots, k, dtype=f64)
    index = A.initial_sparse_link_index(batch, heads, slots, k)
    precedence = torch.zeros(batch, heads, slots, dtype=f64)
    for t in range(steps):
        w = random_write_weights(batch, heads, slots, seed=100 + t)
        dense = A.update_link(dense, precedence, w)
        values, index = A.update_sparse_link(values, index, precedence, w)
        precedence = A.update_precedence(precedence, w)
        yield dense, values, index


def test_sparse_link_equals_dense_when_k_is_n():
    for dense, values, index in run_links(2, 2, 5, k=5, steps=8):
        sorted_index = index.sort(-1).values
        assert torch.equal(sorted_index, torch.arange(5).expand_as(index))  # distinct columns
        torch.testing.assert_close(A.sparse_link_to_dense(values, index), dense)
    reads = torch.softmax(torch.randn(2, 3, 5, dtype=f64), -1)
    for got, want in zip(
        A.sparse_directional_weights(values, index, reads),
        A.directional_weights(dense, reads),
        strict=True,
    ):
        torch.testing.assert_close(got, want)


def test_sparse_link_truncated_keeps_bounds_and_top_entries():
    for dense, values, index in run_links(2, 1, 8, k=2, steps=10):
        sparse = A.sparse_link_to_dense(values, index)
        assert (sparse >= 0).all() and (sparse.diagonal(dim1=-2, dim2=-1) == 0).all()
        assert (sparse.sum(-1) <= 1 + 1e-12).all() and (sparse.sum(-2) <= 1 + 1e-12).all()
        for b in range(2):  # distinct columns per row
            for i in range(8):
                assert index[b, 0, i].unique().numel() == 2
        assert (sparse <= dense + 1e-12).all()  # truncation only removes mass


def test_sparse_link_one_hot_writes_match_dense():
    # hard writes create one entry per row, so K = 1 is already exact
    slots = 6
    order = [3, 1, 5, 0]
    values = torch.zeros(1, 1, slots, 1)
    index = A.initial_sparse_link_index(1, 1, slots, 1)
    dense = torch.zeros(1, 1, slots, slots)
    precedence = torch.zeros(1, 1, slots)
    for slot in order:
        w = torch.zeros(1, 1, slots)
        w[0, 0, slot] = 1.0
        dense = A.update_link(dense, precedence, w)
        values, index = A.update_sparse_link(values, index, precedence, w)
        precedence = A.update_precedence(precedence, w)
    torch.testing.assert_close(A.sparse_link_to_dense(values, index), dense)


def test_sparse_link_gradcheck():
    values = (rand(1, 1, 4, 2) / 4).requires_grad_(True)
    index = torch.tensor([[[[1, 2], [0, 3], [1, 3], [0, 2]]]])
    precedence = (rand(1, 1, 4, seed=1) / 4).requires_grad_(True)
    w = random_write_weights(1, 1, 4, seed=2).requires_grad_(True)

    def update(values, precedence, w):
        return A.update_sparse_link(values, index, precedence, w)[0]

    assert gradcheck(update, (values, precedence, w))
    reads = rand(1, 2, 4, seed=3).requires_grad_(True)

    def directional(values, reads):
        return A.sparse_directional_weights(values, index, reads)

    assert gradcheck(directional, (values, reads))


@pytest.mark.parametrize("sharpness", [1.0, 3.0])
def test_sharpen_normalises_and_handles_zeros(sharpness):
    weights = torch.tensor([[0.0, 0.2, 0.6, 0.0]], dtype=f64, requires_grad=True)
    s = torch.tensor([[sharpness]], dtype=f64, requires_grad=True)
    out = A.sharpen(weights, s)
    expected = weights.detach() ** sharpness
    torch.testing.assert_close(out, expected / (expected.sum() + 1e-6))
    out[0, 2].backward()
    assert torch.isfinite(weights.grad).all() and torch.isfinite(s.grad).all()
    zeros = torch.zeros(1, 4, dtype=f64, requires_grad=True)
    out = A.sharpen(zeros, s)
    assert (out == 0).all()
    out.sum().backward()
    assert torch.isfinite(zeros.grad).all()
