"""DNCMemory: interface layout, one whole step, robustness, options, autocast, errors."""

from __future__ import annotations

import pytest
import torch
from torch.autograd import gradcheck

from relmem import DNCMemory, DNCMemoryState
from relmem.cores.dnc import addressing as A
from relmem.cores.dnc import interface_layout

f64 = torch.float64


@pytest.mark.parametrize("reads,writes", [(1, 1), (4, 1), (2, 3)])
def test_interface_size_formula(reads, writes):
    w = 5
    memory = DNCMemory(None, 7, w, reads, writes)
    expected = reads * w + 3 * writes * w + reads * (3 + 2 * writes) + 3 * writes
    assert memory.interface_size == expected
    deepmind = DNCMemory(None, 7, w, reads, writes, compat="deepmind")
    assert deepmind.interface_size == expected
    assert DNCMemory(None, 7, w, reads, writes, link="none").interface_size == (
        expected - reads * (1 + 2 * writes)
    )


def test_paper_and_deepmind_layout_orders():
    paper = [name for name, _ in interface_layout(4, 2, 1).fields]
    assert paper == [
        "read_keys",
        "read_strengths",
        "write_keys",
        "write_strengths",
        "erase_vectors",
        "write_vectors",
        "free_gates",
        "allocation_gates",
        "write_gates",
        "read_modes",
    ]
    deepmind = [name for name, _ in interface_layout(4, 2, 1, compat="deepmind").fields]
    assert deepmind == [
        "write_vectors",
        "erase_vectors",
        "free_gates",
        "allocation_gates",
        "write_gates",
        "read_modes",
        "write_keys",
        "write_strengths",
        "read_keys",
        "read_strengths",
    ]


def test_split_interface_squashing_and_read_mode_order():
    memory = DNCMemory(None, 4, 3, num_read_heads=2, num_write_heads=2)
    xi = torch.randn(5, memory.interface_size)
    parts = memory.split_interface(xi)
    assert parts.read_keys.shape == (5, 2, 3) and parts.write_keys.shape == (5, 2, 3)
    assert (parts.read_strengths >= 1).all() and (parts.write_strengths >= 1).all()
    for gate in (parts.erase_vectors, parts.free_gates, parts.allocation_gates, parts.write_gates):
        assert ((gate > 0) & (gate < 1)).all()
    assert parts.read_modes.shape == (5, 2, 5)
    torch.testing.assert_close(parts.read_modes.sum(-1), torch.ones(5, 2))
    # paper layout: the raw slice is [b1, b2, c, f1, f2] and stays in that order
    raw = memory.layout.split(xi)["read_modes"].view(5, 2, 5)
    torch.testing.assert_close(parts.read_modes, torch.softmax(raw, -1))

    deepmind = DNCMemory(None, 4, 3, num_read_heads=2, num_write_heads=2, compat="deepmind")
    parts = deepmind.split_interface(xi)
    raw = torch.softmax(deepmind.layout.split(xi)["read_modes"].view(5, 2, 5), -1)
    # deepmind raw order [b1, b2, f1, f2, c] is returned as [b1, b2, c, f1, f2]
    torch.testing.assert_close(parts.read_modes, raw[..., [0, 1, 4, 2, 3]])
    # softplus strengths (≥ 0, not ≥ 1)
    torch.testing.assert_close(
        parts.read_strengths,
        torch.nn.functional.softplus(deepmind.layout.split(xi)["read_strengths"]),
    )


def reference_step(memory: DNCMemory, xi: torch.Tensor, s: DNCMemoryState) -> DNCMemoryState:
    """``docs/dnc.md`` §2 written out for Wh = 1 with the addressing functions (paper mode)."""
    p = memory.split_interface(xi)
    psi = A.retention(p.free_gates, s.read_weights)
    usage = A.update_usage(s.usage, s.write_weights, psi)
    cw = A.content_weights(s.memory, p.write_keys, p.write_strengths)[:, 0]
    alloc = A.allocation_weights(usage)
    ga, gw = p.allocation_gates, p.write_gates
    ww = gw * (ga * alloc + (1 - ga) * cw)  # [B, N]
    new_memory = s.memory * (1 - ww[..., None] * p.erase_vectors) + ww[..., None] * p.write_vectors
    link = A.update_link(s.link, s.precedence, ww[:, None])
    precedence = A.update_precedence(s.precedence, ww[:, None])
    fwd = torch.einsum("bik,brk->bri", link[:, 0], s.read_weights)
    bwd = torch.einsum("bik,bri->brk", link[:, 0], s.read_weights)
    cr = A.content_weights(new_memory, p.read_keys, p.read_strengths)
    pi = p.read_modes
    wr = pi[..., 0:1] * bwd + pi[..., 1:2] * cr + pi[..., 2:3] * fwd
    reads = wr @ new_memory
    return DNCMemoryState(new_memory, usage, link, precedence, wr, ww[:, None], reads)


def run_steps(memory: DNCMemory, xis: torch.Tensor, state=None):
    state = state or memory.initial_state(xis.shape[1])
    for xi in xis:
        _, state = memory(xi, state)
    return state


def test_step_matches_hand_written_reference():
    memory = DNCMemory(None, 5, 3, num_read_heads=2, dtype=f64)
    xis = torch.randn(4, 2, memory.interface_size, dtype=f64) * 2
    state = memory.initial_state(2)
    for xi in xis:
        want = reference_step(memory, xi, state)
        reads, state = memory(xi, state)
        for field in DNCMemoryState._fields[:-1]:
            torch.testing.assert_close(getattr(state, field), getattr(want, field), msg=field)
        torch.testing.assert_close(reads, want.read_vectors)
    # read weights of every head are convex combinations: they sum to at most 1
    assert (state.read_weights.sum(-1) <= 1 + 1e-9).all()


def test_whole_step_gradcheck():
    memory = DNCMemory(None, 4, 2, num_read_heads=2, num_write_heads=1, dtype=f64)
    state = run_steps(memory, torch.randn(3, 1, memory.interface_size, dtype=f64))
    xi = torch.randn(1, memory.interface_size, dtype=f64, requires_grad=True)
    mem0 = state.memory.detach().requires_grad_(True)
    link0 = state.link.detach().requires_grad_(True)

    def step(xi, mem0, link0):
        new = memory.step(xi, state._replace(memory=mem0, link=link0))
        return new.read_vectors, new.memory, new.link, new.usage

    assert gradcheck(step, (xi, mem0, link0))


def test_dnc_memory_with_projection_gradients_reach_parameters():
    memory = DNCMemory(6, 8, 4, 2, 2)
    x = torch.randn(3, 6)
    state = None
    total = 0
    for _ in range(3):
        reads, state = memory(x, state)
        total = total + reads.sum()
    total.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in memory.parameters())


ADVERSARIAL = {
    "zeros": lambda shape: torch.zeros(shape),
    "huge": lambda shape: torch.full(shape, 1e4),
    "huge_negative": lambda shape: torch.full(shape, -1e4),
    "alternating": lambda shape: torch.randn(shape).sign() * 1e4,
}


@pytest.mark.parametrize("kind", list(ADVERSARIAL))
@pytest.mark.parametrize("link", ["dense", "sparse", "none"])
def test_no_nan_or_inf_on_adversarial_interfaces(kind, link):
    memory = DNCMemory(None, 6, 3, 2, 2, link=link, link_topk=3)
    xi = ADVERSARIAL[kind]((2, memory.interface_size)).requires_grad_(True)
    state = memory.initial_state(2)
    outputs = []
    for _ in range(4):
        reads, state = memory(xi, state)
        outputs.append(reads)
    loss = sum(o.sum() for o in outputs) + state.memory.sum() + state.usage.sum()
    loss.backward()
    for tensor in state:
        if tensor is not None and tensor.is_floating_point():
            assert torch.isfinite(tensor).all()
    assert torch.isfinite(xi.grad).all()
    assert ((state.usage >= 0) & (state.usage <= 1)).all()


def test_all_slots_freed_and_zero_keys_are_finite():
    memory = DNCMemory(None, 4, 3, 2)
    xi = torch.zeros(1, memory.interface_size)  # zero keys and vectors
    for gate in ("free_gates", "write_gates", "allocation_gates"):
        xi[:, memory.layout.slice_of(gate)] = 50.0  # free everything that was read, write hard
    xi = xi.requires_grad_(True)
    state = memory.initial_state(1)
    for _ in range(6):
        reads, state = memory(xi, state)
    reads.sum().backward()
    assert torch.isfinite(xi.grad).all() and torch.isfinite(state.memory).all()
    assert ((state.usage >= 0) & (state.usage <= 1)).all()


def test_options_run_and_stay_finite():
    torch.manual_seed(0)
    base = DNCMemory(None, 5, 3, 2)
    for options in (
        {"dealloc_content": True},
        {"key_mask": True},
        {"link_sharpness": True},
        {"interface_clip": 0.5},
        {"usage_write_grad": True},
    ):
        memory = DNCMemory(None, 5, 3, 2, **options)
        xi = (torch.randn(4, 2, memory.interface_size) * 3).requires_grad_(True)
        state = run_steps(memory, xi)
        assert all(torch.isfinite(t).all() for t in state if t is not None)
        state.read_vectors.sum().backward()
        assert torch.isfinite(xi.grad).all() and xi.grad.abs().sum() > 0
    # interface_clip clamps ξ before squashing: ξ and its clipped version give the same step
    clipped = DNCMemory(None, 5, 3, 2, interface_clip=1.0)
    xi = torch.randn(3, 2, base.interface_size) * 5
    torch.testing.assert_close(
        run_steps(clipped, xi).memory, run_steps(base, xi.clamp(-1, 1)).memory
    )


def test_key_mask_masks_keys_and_memory():
    memory = DNCMemory(None, 4, 3, 1, key_mask=True, dtype=f64)
    state = memory.initial_state(1)._replace(memory=torch.randn(1, 4, 3, dtype=f64))
    xi = torch.randn(1, memory.interface_size, dtype=f64)
    parts = memory.split_interface(xi)
    got = memory._content(state.memory, parts.read_keys, parts.read_strengths, parts.read_masks)
    mask = parts.read_masks[:, 0]  # [1, W]
    want = A.content_weights(
        state.memory * mask[:, None], parts.read_keys * mask[:, None], parts.read_strengths
    )
    torch.testing.assert_close(got, want)


def test_dealloc_content_erases_freed_rows():
    memory = DNCMemory(None, 3, 2, 1, dealloc_content=True)
    state = memory.initial_state(1)._replace(
        memory=torch.ones(1, 3, 2), read_weights=torch.tensor([[[0.0, 1.0, 0.0]]])
    )
    xi = torch.zeros(1, memory.interface_size)
    xi[:, memory.layout.slice_of("free_gates")] = 100.0
    xi[:, memory.layout.slice_of("write_gates")] = -100.0
    _, new = memory(xi, state)
    torch.testing.assert_close(new.memory[0, 1], torch.zeros(2), atol=1e-6, rtol=0)
    torch.testing.assert_close(new.memory[0, 0], torch.ones(2), atol=1e-6, rtol=0)


def test_autocast_bfloat16_keeps_memory_in_float32():
    memory = DNCMemory(8, 6, 4, 2)
    x = torch.randn(3, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        reads, state = memory(x)
        reads, state = memory(x, state)
    assert state.memory.dtype == torch.float32 and reads.dtype == torch.float32
    ref_reads, ref_state = memory(x)
    ref_reads, ref_state = memory(x, ref_state)
    # only the interface projection ran in bf16
    torch.testing.assert_close(reads, ref_reads, atol=5e-2, rtol=5e-2)
    reads.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in memory.parameters())


def test_initial_state_shapes_and_link_variants():
    b, n, w, r, wh = 2, 5, 3, 2, 3
    state = DNCMemory(None, n, w, r, wh).initial_state(b)
    assert state.memory.shape == (b, n, w) and state.usage.shape == (b, n)
    assert state.link.shape == (b, wh, n, n) and state.precedence.shape == (b, wh, n)
    assert state.read_weights.shape == (b, r, n) and state.write_weights.shape == (b, wh, n)
    assert state.read_vectors.shape == (b, r, w) and state.link_index is None
    assert all((t == 0).all() for t in state if t is not None)
    sparse = DNCMemory(None, n, w, r, wh, link="sparse", link_topk=2).initial_state(b)
    assert sparse.link.shape == (b, wh, n, 2) and sparse.link_index.dtype == torch.long
    none = DNCMemory(None, n, w, r, wh, link="none").initial_state(b)
    assert none.link is None and none.precedence is None


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"memory_size": 0}, "memory_size must be an integer >= 1, got 0"),
        ({"word_size": 2.5}, "word_size must be an integer >= 1, got 2.5"),
        ({"num_read_heads": True}, "num_read_heads must be an integer >= 1, got True"),
        ({"compat": "sonnet"}, "compat must be one of 'paper', 'deepmind', got 'sonnet'"),
        ({"link": "full"}, "link must be one of 'dense', 'sparse', 'none', got 'full'"),
        ({"link": "sparse", "link_topk": 9}, "link_topk must be at most memory_size = 8, got 9"),
        ({"interface_clip": -1.0}, "interface_clip must be a float >= 0"),
        ({"eps": 0.0}, "eps must be a float in (0, 0.1)"),
    ],
)
def test_bad_options_raise_clear_errors(kwargs, message):
    args = {"input_size": 4, "memory_size": 8, **kwargs}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        DNCMemory(**args)


def test_bad_inputs_and_states_raise_clear_errors():
    memory = DNCMemory(4, 8, 3, 2)
    with pytest.raises(ValueError, match=r"expected input \[B, input_size=4\], got shape \(2, 5\)"):
        memory(torch.randn(2, 5))
    with pytest.raises(TypeError, match="input dtype torch.float64 differs"):
        memory(torch.randn(2, 4, dtype=f64))
    with pytest.raises(TypeError, match="must be floating point"):
        memory(torch.ones(2, 4, dtype=torch.long))
    state = memory.initial_state(2)
    with pytest.raises(ValueError, match=r"state.memory batch size mismatch: expected shape"):
        memory(torch.randn(3, 4), state)
    bad = state._replace(link=torch.zeros(2, 1, 8, 7))
    with pytest.raises(ValueError, match=r"state.link dim 3 mismatch: expected shape \[2, 1, 8, 8"):
        memory(torch.randn(2, 4), bad)
    with pytest.raises(TypeError, match="state.usage has dtype torch.float64"):
        memory(torch.randn(2, 4), state._replace(usage=state.usage.double()))
    none = DNCMemory(4, 8, 3, 2, link="none")
    with pytest.raises(ValueError, match=r"state.link must be None with link='none'"):
        none(torch.randn(2, 4), state)
    with pytest.raises(TypeError, match="state must be a DNCMemoryState"):
        memory(torch.randn(2, 4), torch.zeros(2, 8, 3))
