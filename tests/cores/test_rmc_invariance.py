"""Sequence invariances of the RMC (``docs/rmc.md`` §5, §10 E11, §12.10)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from relmem import RelationalMemory, RMCState, detach_state

T, B = 5, 3


CONFIGS = {
    "vector-unit": {},
    "matrix2-memory-b2": {"input_rows": 2, "gate_style": "memory", "num_blocks": 2},
    "vector-none-K3": {"gate_style": None, "key_size": 3},
    "vector-unit-outgate-b2": {"output_gate": True, "num_blocks": 2},
    "matrix2-unit-qmem-b2-trainable": {
        "input_rows": 2,
        "query_rows": "memory",
        "num_blocks": 2,
        "trainable_gate_biases": True,
    },
}


def make(name: str, batch_first: bool = False) -> RelationalMemory:
    torch.manual_seed(0)
    core = RelationalMemory(
        input_size=3,
        mem_slots=2,
        head_size=2,
        num_heads=2,
        batch_first=batch_first,
        dtype=torch.float64,
        **CONFIGS[name],
    )
    with torch.no_grad():  # non-trivial biases and LN affine parameters
        for param in core.parameters():
            param.add_(0.1 * torch.randn_like(param))
    return core


def sequence(core: RelationalMemory, steps: int = T, batch: int = B, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    rows = core.config.input_rows
    shape = (steps, batch, 3) if rows is None else (steps, batch, rows, 3)
    return torch.randn(shape, generator=gen, dtype=torch.float64)


def random_state(core: RelationalMemory, batch: int = B, seed: int = 2) -> RMCState:
    gen = torch.Generator().manual_seed(seed)
    memory = torch.randn(batch, *core.state_size, generator=gen, dtype=torch.float64)
    hidden = torch.tanh(memory) * 0.7 if core.config.output_gate else None
    return RMCState(memory, hidden)


def leaves(state: RMCState) -> list[torch.Tensor]:
    return [t for t in state if t is not None]


def grads_of(loss: torch.Tensor, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return list(torch.autograd.grad(loss, tensors, allow_unused=False))


def close(a, b, **kw):
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, **kw)


def loss_of(output: torch.Tensor, state: RMCState, seed: int = 3) -> torch.Tensor:
    """Random upstream gradients for both the outputs and the final state (every output is
    checked backward)."""
    gen = torch.Generator().manual_seed(seed)
    total = (output * torch.randn(output.shape, generator=gen, dtype=output.dtype)).sum()
    for t in leaves(state):
        total = total + (t * torch.randn(t.shape, generator=gen, dtype=t.dtype)).sum()
    return total


def with_grad(state: RMCState) -> RMCState:
    return RMCState(*(None if t is None else t.clone().requires_grad_() for t in state))


# ---------------------------------------------------------------- sequence == cell loop


@pytest.mark.parametrize("name", list(CONFIGS))
def test_sequence_equals_cell_loop(name):
    core = make(name)
    x = sequence(core).requires_grad_()
    s0 = with_grad(random_state(core))
    out, final = core(x, s0)

    state, outs = s0, []
    for t in range(T):
        y, state = core.cell(x[t], state)
        outs.append(y)
    close(out, torch.stack(outs))
    for a, b in zip(leaves(final), leaves(state), strict=True):
        close(a, b)

    params = list(core.parameters())
    wrt = [x, *leaves(s0), *params]
    got = grads_of(loss_of(out, final), wrt)
    want = grads_of(loss_of(torch.stack(outs), state), wrt)
    for g, w in zip(got, want, strict=True):
        close(g, w)


@pytest.mark.parametrize("name", ["vector-unit", "matrix2-memory-b2"])
def test_batch_first_is_a_transpose(name):
    core_tm, core_bf = make(name), make(name, batch_first=True)
    x = sequence(core_tm)
    out_tm, final_tm = core_tm(x)
    out_bf, final_bf = core_bf(x.transpose(0, 1).contiguous())
    close(out_bf, out_tm.transpose(0, 1))
    close(final_bf.memory, final_tm.memory)  # the state is batch-leading in both layouts
    lengths = torch.tensor([5, 2, 4])
    out_tm, final_tm = core_tm(x, lengths=lengths)
    out_bf, final_bf = core_bf(x.transpose(0, 1), lengths=lengths)
    close(out_bf, out_tm.transpose(0, 1))
    close(final_bf.memory, final_tm.memory)


def test_state_none_means_initial_state():
    core = make("vector-unit-outgate-b2")
    x = sequence(core)
    out_a, final_a = core(x)
    out_b, final_b = core(x, core.initial_state(B))
    close(out_a, out_b)
    for a, b in zip(leaves(final_a), leaves(final_b), strict=True):
        close(a, b)
    y_a, s_a = core.cell(x[0])
    y_b, s_b = core.cell(x[0], core.initial_state(B))
    close(y_a, y_b)
    close(s_a.memory, s_b.memory)


def test_memory_tensor_accepted_as_state():
    core = make("vector-unit")
    x = sequence(core)
    s0 = random_state(core)
    out_a, final_a = core(x, s0)
    out_b, final_b = core(x, s0.memory)
    close(out_a, out_b)
    close(final_a.memory, final_b.memory)


# ---------------------------------------------------------------- chunks with carried state


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("split", [1, 3])
def test_chunks_with_carried_state(name, split):
    core = make(name)
    x = sequence(core).requires_grad_()
    s0 = with_grad(random_state(core))
    out, final = core(x, s0)
    out1, mid = core(x[:split], s0)
    out2, final2 = core(x[split:], mid)
    close(out, torch.cat([out1, out2]))
    for a, b in zip(leaves(final), leaves(final2), strict=True):
        close(a, b)
    # Gradients flow across the chunk boundary exactly as through the whole unroll.
    wrt = [x, *leaves(s0), *core.parameters()]
    got = grads_of(loss_of(torch.cat([out1, out2]), final2), wrt)
    want = grads_of(loss_of(out, final), wrt)
    for g, w in zip(got, want, strict=True):
        close(g, w)


# ---------------------------------------------------------------- batch rows are independent


@pytest.mark.parametrize("name", list(CONFIGS))
def test_each_example_alone_equals_its_batch_row(name):
    core = make(name)
    x = sequence(core)
    s0 = random_state(core)
    out, final = core(x, s0)
    for b in range(B):
        alone = RMCState(*(None if t is None else t[b : b + 1] for t in s0))
        out_b, final_b = core(x[:, b : b + 1], alone)
        close(out_b[:, 0], out[:, b])
        for a, c in zip(leaves(final_b), leaves(final), strict=True):
            close(a[0], c[b])
    # Changing one example's input changes no other row.
    x2 = x.clone()
    x2[:, 1] += 1.0
    out2, _ = core(x2, s0)
    close(out2[:, 0], out[:, 0])
    close(out2[:, 2], out[:, 2])
    assert not torch.allclose(out2[:, 1], out[:, 1])


# ---------------------------------------------------------------- lengths


@pytest.mark.parametrize("name", list(CONFIGS))
def test_lengths_final_state_and_zero_padding(name):
    core = make(name)
    x = sequence(core).requires_grad_()
    s0 = random_state(core)
    lengths = [5, 2, 0]
    out, final = core(x, s0, lengths=torch.tensor(lengths))
    for b, length in enumerate(lengths):
        alone = RMCState(*(None if t is None else t[b : b + 1] for t in s0))
        if length > 0:
            out_b, final_b = core(x[:length, b : b + 1], alone)
            close(out[:length, b], out_b[:, 0])
        else:
            final_b = alone  # length 0: the state is carried unchanged from the start
        for a, c in zip(leaves(final_b), leaves(final), strict=True):
            close(c[b], a[0])
        assert torch.equal(out[length:, b], torch.zeros_like(out[length:, b]))
    # Padded inputs change nothing and receive a zero gradient.
    (grad_x,) = torch.autograd.grad(loss_of(out, final), [x])
    assert torch.equal(grad_x[2:, 1], torch.zeros_like(grad_x[2:, 1]))
    assert torch.equal(grad_x[:, 2], torch.zeros_like(grad_x[:, 2]))
    assert grad_x[:2, 1].abs().sum() > 0
    x2 = x.detach().clone()
    x2[2:, 1] = 100.0
    x2[:, 2] = -7.0
    out2, final2 = core(x2, s0, lengths=lengths)  # a list of ints is accepted too
    close(out2, out)
    for a, c in zip(leaves(final2), leaves(final), strict=True):
        close(a, c)


def test_full_lengths_equal_no_lengths():
    core = make("vector-unit")
    x = sequence(core)
    out_a, final_a = core(x)
    out_b, final_b = core(x, lengths=torch.full((B,), T))
    close(out_a, out_b)
    close(final_a.memory, final_b.memory)


@pytest.mark.parametrize("name", ["vector-unit", "matrix2-memory-b2", "vector-unit-outgate-b2"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_packed_sequence_equals_padded_with_lengths(name, batch_first):
    core = make(name, batch_first=batch_first)
    x = sequence(core)  # time-major
    lengths = torch.tensor([2, 5, 3])  # unsorted on purpose
    s0 = random_state(core)
    padded_in = x.transpose(0, 1) if batch_first else x
    out_pad, final_pad = core(padded_in, s0, lengths=lengths)
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    out_packed, final_packed = core(packed, s0)
    assert isinstance(out_packed, torch.nn.utils.rnn.PackedSequence)
    unpacked, unpacked_lengths = pad_packed_sequence(out_packed, batch_first=batch_first)
    assert torch.equal(unpacked_lengths, lengths)
    close(unpacked, out_pad)
    for a, c in zip(leaves(final_packed), leaves(final_pad), strict=True):
        close(a, c)


# ---------------------------------------------------------------- gradients through time


@pytest.mark.parametrize("name", ["vector-unit", "vector-unit-outgate-b2", "vector-none-K3"])
def test_gradient_reaches_initial_state_through_the_unroll(name):
    core = make(name)
    x = sequence(core)
    s0 = with_grad(random_state(core))
    out, final = core(x, s0)
    assert final.memory.grad_fn is not None  # never detached
    # Only the last output depends on s0 through all T steps.
    grads = torch.autograd.grad(out[-1].sum(), leaves(s0))
    for g in grads:
        assert torch.isfinite(g).all()
        assert g.abs().sum() > 0

    # Stepping the cell by hand keeps the graph too.
    state = s0
    for t in range(T):
        y, state = core.cell(x[t], state)
    grads = torch.autograd.grad(y.sum(), leaves(s0))
    assert all(g.abs().sum() > 0 for g in grads)


def test_gradient_reaches_parameters_from_initial_identity_state():
    core = make("vector-unit")
    x = sequence(core).requires_grad_()
    out, _ = core(x)
    (g,) = torch.autograd.grad(out[-1].sum(), [x])
    assert g[0].abs().sum() > 0  # the first input influences the last output


def test_detach_state_cuts_the_graph():
    core = make("vector-unit-outgate-b2")
    x = sequence(core)
    s0 = with_grad(random_state(core))
    _, mid = core(x[:2], s0)
    cut = detach_state(mid)
    assert isinstance(cut, RMCState)
    for a, c in zip(leaves(cut), leaves(mid), strict=True):
        assert not a.requires_grad
        assert a.grad_fn is None
        assert torch.equal(a, c)
    assert mid.memory.grad_fn is not None  # the original is untouched
    out, _ = core(x[2:], cut)
    out.sum().backward()
    assert s0.memory.grad is None and s0.hidden.grad is None
    assert all(p.grad is not None for p in core.parameters())
    # None leaves and plain tensors/tuples are handled.
    plain = RMCState(mid.memory)
    assert detach_state(plain).hidden is None
    assert not detach_state(mid.memory).requires_grad
    assert detach_state(None) is None
    pair = detach_state((mid.memory, [mid.hidden]))
    assert isinstance(pair, tuple) and isinstance(pair[1], list)
    assert not pair[1][0].requires_grad


def test_truncated_bptt_windows_match_full_forward_values():
    core = make("vector-unit")
    x = sequence(core, steps=6)
    out_full, final_full = core(x)
    state, outs = None, []
    for window in x.split(2):
        out, state = core(window, state)
        outs.append(out)
        state = detach_state(state)
    close(torch.cat(outs), out_full.detach())
    close(state.memory, final_full.memory.detach())


def test_deterministic():
    core = make("matrix2-memory-b2")
    x = sequence(core)
    out_a, final_a = core(x)
    out_b, final_b = core(x)
    assert torch.equal(out_a, out_b)
    assert torch.equal(final_a.memory, final_b.memory)
