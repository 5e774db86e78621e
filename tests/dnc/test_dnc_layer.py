"""MemoryControllerLayer: shape-preserving residual layer, padding, chunks, bidirectional."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from relmem import MemoryControllerLayer
from relmem.cores.base import map_state
from relmem.cores.dnc.layer import reverse_within_lengths

f64 = torch.float64


def make(**kwargs) -> MemoryControllerLayer:
    torch.manual_seed(0)
    args = {"memory_slots": 5, "word_size": 3, "read_heads": 2, "dtype": f64}
    args.update(kwargs)
    return MemoryControllerLayer(6, **args)


def tokens(steps: int = 5, batch: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.randn(steps, batch, 6, generator=torch.Generator().manual_seed(seed), dtype=f64)


@pytest.mark.parametrize("controller", ["gru", "lstm"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_keeps_shape_and_backpropagates(controller, bidirectional):
    layer = make(controller=controller, bidirectional=bidirectional)
    x = tokens().requires_grad_(True)
    output, state = layer(x)
    assert output.shape == x.shape and state.memory.shape == (3, 5, 3)
    assert (output >= 0).all()  # ReLU(W_v v + d)
    output.sum().backward()
    for name, parameter in layer.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name
    assert x.grad.abs().sum() > 0


def test_output_formula_and_residual():
    layer = make()
    x = tokens()
    output, _ = layer(x)
    # recompute o_t = ReLU(W_v (W_h h_t + W_m r_t + b) + b_v + d_t) step by step
    state = layer.initial_state(3)
    for t in range(x.shape[0]):
        z = torch.cat([x[t], state.read_vectors.flatten(1)], -1)
        h, controller = layer.controller(z, state.controller)
        memory = layer.memory.step(layer.memory.interface(h), state.memory_state)
        v = layer.hidden_projection(h) + layer.read_projection(memory.read_vectors.flatten(1))
        expected = torch.relu(layer.output_projection(v) + x[t])
        torch.testing.assert_close(output[t], expected)
        state = state.combine(memory, controller)


def test_padded_tokens_change_no_state_and_output_zero():
    layer = make()
    x = tokens(6)
    lengths = torch.tensor([6, 3, 1])
    output, state = layer(x, lengths=lengths)
    for b, length in enumerate(lengths.tolist()):
        alone, alone_state = layer(x[:length, b : b + 1])
        torch.testing.assert_close(output[:length, b], alone[:, 0])
        assert (output[length:, b] == 0).all()
        map_state(lambda s, a, b=b: torch.testing.assert_close(s[b], a[0]), state, alone_state)


def test_bidirectional_respects_lengths():
    layer = make(bidirectional=True)
    x = tokens(6)
    lengths = torch.tensor([6, 4, 2])
    output, _ = layer(x, lengths=lengths)
    for b, length in enumerate(lengths.tolist()):
        alone, _ = layer(x[:length, b : b + 1])
        torch.testing.assert_close(output[:length, b], alone[:, 0])
    # the backward direction sees the future: changing the last token changes earlier outputs
    x2 = x.clone()
    x2[-1, 0] += 1.0
    output2, _ = layer(x2, lengths=lengths)
    assert not torch.allclose(output2[0, 0], output[0, 0])
    torch.testing.assert_close(output2[:, 1:], output[:, 1:])


def test_reverse_within_lengths():
    x = torch.arange(4.0).view(4, 1, 1).expand(4, 2, 1)
    got = reverse_within_lengths(x, torch.tensor([4, 2]))
    assert got[:, 0, 0].tolist() == [3, 2, 1, 0] and got[:, 1, 0].tolist() == [1, 0, 2, 3]


def test_chunks_with_carried_state_and_batch_first():
    layer = make()
    x = tokens(6)
    output, state = layer(x)
    first, mid = layer(x[:4])
    second, end = layer(x[4:], mid)
    torch.testing.assert_close(torch.cat([first, second]), output)
    map_state(torch.testing.assert_close, end, state)
    layer.batch_first = True
    output_bf, _ = layer(x.transpose(0, 1))
    torch.testing.assert_close(output_bf, output.transpose(0, 1))


def test_pre_encoder_and_inserted_between_layers():
    pre = nn.Linear(6, 6, dtype=f64)
    layer = make(pre_encoder=pre)
    encoder = nn.Sequential(nn.Linear(6, 6, dtype=f64))
    x = tokens()
    hidden = encoder(x)
    output, _ = layer(hidden)
    assert output.shape == hidden.shape
    output.sum().backward()
    assert pre.weight.grad is not None and encoder[0].weight.grad is not None
    bad = make(pre_encoder=nn.Linear(6, 4, dtype=f64))
    with pytest.raises(ValueError, match=r"pre_encoder must keep the shape \(5, 3, 6\)"):
        bad(x)
    # nn.GRU returns (output, h_n): the error says so instead of failing on a tuple
    with pytest.raises(TypeError, match=r"pre_encoder must return one tensor.*got tuple"):
        make(pre_encoder=nn.GRU(6, 6, dtype=f64))(x)
    with pytest.raises(TypeError, match="pre_encoder must be None or an nn.Module, got str"):
        make(pre_encoder="gru")


def test_sparse_and_no_link_variants_run():
    for link in ("sparse", "none"):
        layer = make(link=link, link_topk=2)
        output, state = layer(tokens(), lengths=[5, 2, 3])
        assert torch.isfinite(output).all()
        assert (state.link is None) == (link == "none")


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="d_model must be an integer >= 1, got 0"):
        MemoryControllerLayer(0)
    with pytest.raises(ValueError, match="controller must be 'gru' or 'lstm', got 'rnn'"):
        MemoryControllerLayer(4, controller="rnn")
    # the memory's options are named as the layer's caller wrote them
    with pytest.raises(
        ValueError,
        match="^MemoryControllerLayer: link_topk must be at most memory_slots = 4, got 9",
    ):
        MemoryControllerLayer(6, 4, 3, 2, link="sparse", link_topk=9)
    with pytest.raises(
        ValueError, match="^MemoryControllerLayer: read_heads must be an integer >= 1, got 0"
    ):
        MemoryControllerLayer(6, read_heads=0)
    with pytest.raises(ValueError, match="^MemoryControllerLayer: eps must be a float in"):
        MemoryControllerLayer(6, eps=0.5)
    layer = make()
    with pytest.raises(ValueError, match=r"d_model=6 features per step.*shape \(5, 3, 4\)"):
        layer(torch.randn(5, 3, 4, dtype=f64))
    # a wrong rank shows the shape as passed (batch-first here), not the time-major one
    with pytest.raises(ValueError, match=r"expected input of rank 3, got shape \(3, 5, 6, 1\)"):
        make(batch_first=True)(torch.randn(3, 5, 6, 1, dtype=f64))
    with pytest.raises(ValueError, match=r"state.controller\[0\] batch size mismatch"):
        state = layer.initial_state(3)
        layer(tokens(batch=3), state._replace(controller=(torch.zeros(2, 6, dtype=f64),)))
