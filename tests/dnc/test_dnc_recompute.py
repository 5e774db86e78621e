"""``recompute_steps``: the DNC and the memory controller layer run in checkpointed chunks.

Against the same module run whole, in float64: outputs, every field of the final state, and
the gradients of the parameters, the input and the initial state, on the fused path and the
reference, with lengths that end inside, at and before a chunk's edge.
"""

from __future__ import annotations

import ctypes

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

import relmem.cores.dnc.fused as fused_module
from relmem import DNC, MemoryControllerLayer
from relmem.cores.base import map_state
from relmem.models import DNCModelConfig
from relmem.models.dnc import build_dnc
from relmem.models.reader import DNCMemory as ReaderMemory
from relmem.models.reader import ReaderOptions

f64 = torch.float64

fused_module.load_dnc_ops()


def _leaves(state) -> list[torch.Tensor]:
    leaves: list[torch.Tensor] = []
    map_state(lambda t: leaves.append(t), state)
    return leaves


def _random_initial_state(module, batch: int):
    """A state with every field away from zero, as leaves that take gradients."""
    generator = torch.Generator().manual_seed(3)
    zero = module.initial_state(batch)
    return map_state(
        lambda t: (
            (t + 0.1 * torch.rand(t.shape, generator=generator, dtype=t.dtype))
            .softmax(-1)
            .requires_grad_()
        ),
        zero,
    )


def _run_and_grad(module, x, state, **kwargs):
    """Output, final state and the gradients of parameters, input and initial state."""
    module.zero_grad()
    x = x.detach().requires_grad_()
    state = map_state(lambda t: t.detach().requires_grad_(), state)
    output, final = module(x, state, **kwargs)
    loss = output.square().sum() + sum(t.sin().sum() for t in _leaves(final))
    loss.backward()
    grads = [p.grad.clone() for p in module.parameters()]
    grads += [x.grad, *(t.grad for t in _leaves(state))]
    return output.detach(), [t.detach() for t in _leaves(final)], grads


def _assert_same(got, want) -> None:
    for a, b in zip(got, want, strict=True):
        if isinstance(a, list):
            _assert_same(a, b)
        else:
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("implementation", ["auto", "reference"])
@pytest.mark.parametrize("chunk", [1, 3, 4])
def test_the_dnc_in_recomputed_chunks_is_the_dnc(implementation: str, chunk: int) -> None:
    kwargs = {
        "input_size": 5,
        "hidden_size": 7,
        "memory_size": 6,
        "word_size": 4,
        "num_read_heads": 2,
        "num_layers": 2,
        "implementation": implementation,
        "dtype": f64,
    }
    torch.manual_seed(0)
    whole = DNC(**kwargs)
    chunked = DNC(**kwargs, recompute_steps=chunk)
    chunked.load_state_dict(whole.state_dict())
    x = torch.randn(7, 4, 5, dtype=f64)
    state = _random_initial_state(whole, 4)
    lengths = torch.tensor([7, 2, 3, 0])  # inside, at and before a chunk's edge; empty
    want = _run_and_grad(whole, x, state, lengths=lengths)
    got = _run_and_grad(chunked, x, state, lengths=lengths)
    _assert_same(got, want)


@pytest.mark.parametrize("implementation", ["auto", "reference"])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("link", ["dense", "none"])
def test_the_layer_in_recomputed_chunks_is_the_layer(
    implementation: str, bidirectional: bool, link: str
) -> None:
    kwargs = {
        "d_model": 6,
        "memory_slots": 5,
        "word_size": 3,
        "read_heads": 2,
        "bidirectional": bidirectional,
        "link": link,
        "implementation": implementation,
        "dtype": f64,
    }
    torch.manual_seed(0)
    whole = MemoryControllerLayer(**kwargs)
    chunked = MemoryControllerLayer(**kwargs, recompute_steps=3)
    chunked.load_state_dict(whole.state_dict())
    x = torch.randn(8, 3, 6, dtype=f64)
    state = _random_initial_state(whole, 3)
    lengths = torch.tensor([8, 3, 5])
    _assert_same(
        _run_and_grad(chunked, x, state, lengths=lengths),
        _run_and_grad(whole, x, state, lengths=lengths),
    )
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    torch.testing.assert_close(chunked(packed)[0].data, whole(packed)[0].data)


def _saved_bytes(module, x) -> int:
    """What autograd keeps for the backward of one forward (outside any recomputation)."""
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        output, _ = module(x)
    output.sum().backward()
    return total


@pytest.mark.parametrize("implementation", ["auto", "reference"])
def test_recomputation_keeps_a_chunk_not_the_sequence(implementation: str) -> None:
    torch.manual_seed(0)
    sizes = {"d_model": 8, "memory_slots": 16, "word_size": 4, "read_heads": 1}
    whole = MemoryControllerLayer(**sizes, implementation=implementation)
    chunked = MemoryControllerLayer(**sizes, implementation=implementation, recompute_steps=8)
    chunked.load_state_dict(whole.state_dict())
    x = torch.randn(64, 2, 8)
    kept, kept_chunked = _saved_bytes(whole, x), _saved_bytes(chunked, x)
    assert kept_chunked < kept / 4, (kept_chunked, kept)


def test_the_sequence_operator_runs_again_in_the_backward(monkeypatch) -> None:
    calls = []
    run = fused_module.sequence

    def counted(*args, **kwargs):
        calls.append(args[0].shape[0])
        return run(*args, **kwargs)

    monkeypatch.setattr(fused_module, "sequence", counted)
    dnc = DNC(3, 5, 4, 3, 1, recompute_steps=4)
    output, _ = dnc(torch.randn(10, 2, 3))
    assert calls == [4, 4, 2]
    output.sum().backward()
    assert sorted(calls) == [2, 2, 4, 4, 4, 4]  # each chunk once more, in reverse
    calls.clear()
    with torch.no_grad():  # nothing to recompute for: one pass over the whole sequence
        dnc(torch.randn(10, 2, 3))
    assert calls == [10]


@pytest.mark.parametrize("bad", [0, -3, 2.5, "8"])
def test_a_bad_recompute_steps_is_named(bad) -> None:
    with pytest.raises(ValueError, match="DNC: recompute_steps must be None or an integer >= 1"):
        DNC(3, 5, recompute_steps=bad)
    with pytest.raises(
        ValueError, match="MemoryControllerLayer: recompute_steps must be None or an integer"
    ):
        MemoryControllerLayer(6, recompute_steps=bad)


def _live_bytes() -> int:
    """The bytes glibc's malloc has handed out and not had back (heap and mmap)."""

    class Mallinfo2(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in [
                "arena",
                "ordblks",
                "smblks",
                "hblks",
                "hblkhd",
                "usmblks",
                "fsmblks",
                "uordblks",
                "fordblks",
                "keepcost",
            ]
        ]

    mallinfo2 = ctypes.CDLL(None).mallinfo2
    mallinfo2.restype = Mallinfo2
    info = mallinfo2()
    return info.uordblks + info.hblkhd


@pytest.mark.skipif(
    not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="needs glibc's mallinfo2 (2.33+)"
)
def test_recomputed_passes_leak_nothing() -> None:
    torch.manual_seed(0)
    sizes = {"d_model": 16, "memory_slots": 32, "word_size": 8, "read_heads": 2}
    layer = MemoryControllerLayer(**sizes, recompute_steps=10, dtype=f64)
    x = torch.randn(60, 8, 16, dtype=f64)
    whole = _saved_bytes(MemoryControllerLayer(**sizes, dtype=f64), x)

    def one_pass() -> None:
        output, state = layer(x)
        (output.sum() + state.link.sum()).backward()

    one_pass()
    before = _live_bytes()
    for _ in range(3):
        one_pass()
    grown = _live_bytes() - before
    assert grown < whole / 10, (grown, whole)  # early stop leaked a pass's worth each time


def test_the_trainers_dnc_option_reaches_the_dnc_and_the_readers_memory() -> None:
    assert build_dnc(DNCModelConfig(recompute_steps=50), 3, None).recompute_steps == 50
    assert build_dnc(DNCModelConfig(), 3, None).recompute_steps is None  # 0: keep every step
    options = ReaderOptions(
        vocab_size=30, char_vocab_size=12, question_block=4, chars=3, word_size=6,
        char_embedding=4, char_channels=5, char_kernel=3, hidden_size=4, attention_window=4,
    )  # fmt: skip
    memory = ReaderMemory(8, options, DNCModelConfig(memory_size=4, recompute_steps=20))
    assert memory.layer.recompute_steps == 20
    with pytest.raises(ValueError, match=r"dnc\.recompute_steps must be >= 0, got -1"):
        DNCModelConfig(recompute_steps=-1)
