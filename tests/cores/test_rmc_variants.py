"""Gating behaviour, key size and the paper/patent variants
(``docs/rmc.md`` §9, §12.5-§12.7, §12.11)."""

from __future__ import annotations

import math

import pytest
import torch

from relmem import RelationalMemory, RelationalMemoryCell, RMCState

BASE = {"input_size": 3, "mem_slots": 3, "head_size": 2, "num_heads": 2}


def perturb_(module: torch.nn.Module, seed: int = 1) -> None:
    """Non-trivial biases and LayerNorm affine parameters."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float64)
            param.add_(0.2 * noise.to(param.dtype))


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def rand(*shape, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


# ---------------------------------------------------------------- `docs/rmc.md` §12.5


@pytest.mark.parametrize("input_rows", [None, 2], ids=["vector", "matrix2"])
def test_no_gating_changes_memory(input_rows):
    torch.manual_seed(0)
    cell = RelationalMemoryCell(**BASE, gate_style=None, input_rows=input_rows)
    shape = (2, 3) if input_rows is None else (2, input_rows, 3)
    m0 = cell.initial_state(2).memory
    out, state = cell(torch.randn(shape))
    assert not torch.allclose(state.memory, m0)
    # 4.6: the new memory is the attention output m~ itself; after the final LayerNorm (γ=1,
    # β=0) every slot has zero mean and unit variance over its M features.
    var, mean = torch.var_mean(state.memory, dim=-1, unbiased=False)
    torch.testing.assert_close(mean, torch.zeros_like(mean), atol=1e-5, rtol=0)
    torch.testing.assert_close(var, torch.ones_like(var), atol=1e-3, rtol=0)
    torch.testing.assert_close(out, state.memory.flatten(1), rtol=0, atol=0)


# ---------------------------------------------------------------- `docs/rmc.md` §12.6


@pytest.mark.parametrize("gate_style", ["unit", "memory"])
@pytest.mark.parametrize("trainable", [False, True], ids=["constant-bias", "trainable-bias"])
@pytest.mark.parametrize("input_rows", [None, 2], ids=["vector", "matrix2"])
def test_input_erasure_is_bitwise(gate_style, trainable, input_rows):
    torch.manual_seed(0)
    cell = RelationalMemoryCell(
        **BASE,
        gate_style=gate_style,
        forget_bias=math.inf,
        input_bias=-math.inf,
        trainable_gate_biases=trainable,
        input_rows=input_rows,
    )
    perturb_(cell)
    if trainable:  # perturbation leaves ±inf as it is
        assert cell.gate_biases.tolist() == [-math.inf, math.inf]
    shape = (2, 3) if input_rows is None else (2, input_rows, 3)
    ones = torch.ones(shape)
    for start in (cell.initial_state(2).memory, torch.randn(2, 3, 4)):
        out, state, details = cell(ones, start, return_details=True)
        assert torch.equal(state.memory, start)
        assert torch.equal(out, start.flatten(1))
        assert torch.equal(details.input_gate, torch.zeros_like(details.input_gate))
        assert torch.equal(details.forget_gate, torch.ones_like(details.forget_gate))
    # Over a sequence the memory stays the initial one.
    core = RelationalMemory(
        **BASE,
        gate_style=gate_style,
        forget_bias=math.inf,
        input_bias=-math.inf,
        input_rows=input_rows,
    )
    _, final = core(torch.ones(4, *shape))
    assert torch.equal(final.memory, core.initial_state(2).memory)


# ---------------------------------------------------------------- `docs/rmc.md` §12.7


@pytest.mark.parametrize("query_rows", ["all", "memory"])
def test_key_size_differs_from_head_size(query_rows):
    torch.manual_seed(0)
    h, d, k = 2, 32, 128
    cell = RelationalMemoryCell(
        input_size=3, mem_slots=4, head_size=d, num_heads=h, key_size=k, query_rows=query_rows
    )
    assert cell.config.resolved_key_size == k
    assert cell.blocks[0].qkv.weight.shape == (h * (2 * k + d), h * d)
    assert cell.blocks[0].qkv_norm.weight.shape == (h * (2 * k + d),)
    out, state, details = cell(torch.randn(5, 3), return_details=True)
    assert out.shape == (5, 4 * h * d)
    assert state.memory.shape == (5, 4, h * d)
    assert torch.isfinite(out).all()
    rows_q = 5 if query_rows == "all" else 4
    assert details.attention[0].shape == (5, h, rows_q, 5)
    out.sum().backward()
    assert all(p.grad is not None for p in cell.parameters())


# ---------------------------------------------------------------- `docs/rmc.md` §9.1


def _pair(extra_a, extra_b, seed=0, **common):
    torch.manual_seed(seed)
    a = RelationalMemory(**BASE, dtype=torch.float64, **common, **extra_a)
    perturb_(a)
    b = RelationalMemory(**BASE, dtype=torch.float64, **common, **extra_b)
    return a, b


@pytest.mark.parametrize("input_rows", [None, 2], ids=["vector", "matrix2"])
@pytest.mark.parametrize("gate_style", ["unit", None])
def test_query_rows_memory_equals_default_with_one_block(input_rows, gate_style):
    default, memq = _pair(
        {}, {"query_rows": "memory"}, num_blocks=1, input_rows=input_rows, gate_style=gate_style
    )
    memq.load_state_dict(default.state_dict())
    shape = (4, 2, 3) if input_rows is None else (4, 2, input_rows, 3)
    x = rand(*shape)
    out_a, final_a = default(x)
    out_b, final_b = memq(x)
    close(out_b, out_a)
    close(final_b.memory, final_a.memory)


@pytest.mark.parametrize("input_rows", [None, 2], ids=["vector", "matrix2"])
def test_query_rows_memory_differs_with_two_blocks(input_rows):
    default, memq = _pair({}, {"query_rows": "memory"}, num_blocks=2, input_rows=input_rows)
    memq.load_state_dict(default.state_dict())
    shape = (4, 2, 3) if input_rows is None else (4, 2, input_rows, 3)
    x = rand(*shape)
    out_a, _ = default(x)
    out_b, _ = memq(x)
    assert (out_a - out_b).abs().max() > 1e-3


# ---------------------------------------------------------------- `docs/rmc.md` §9.3


def test_own_mlp_equals_default_with_one_block():
    default, own = _pair({}, {"share_attention_mlp": False}, num_blocks=1)
    assert set(default.state_dict()) == set(own.state_dict())
    own.load_state_dict(default.state_dict())
    x = rand(4, 2, 3)
    out_a, final_a = default(x)
    out_b, final_b = own(x)
    close(out_b, out_a)
    close(final_b.memory, final_a.memory)


def test_own_mlps_with_copied_weights_equal_shared_mlp_and_differ_otherwise():
    shared, own = _pair({}, {"share_attention_mlp": False}, num_blocks=2)
    assert len(shared.cell.mlps) == 1 and len(own.cell.mlps) == 2
    state = shared.state_dict()
    for key, value in list(state.items()):
        if key.startswith("cell.mlps.0."):
            state[key.replace("mlps.0.", "mlps.1.")] = value
    own.load_state_dict(state)
    x = rand(4, 2, 3)
    out_a, _ = shared(x)
    out_b, _ = own(x)
    close(out_b, out_a)
    with torch.no_grad():  # block 2 must use its own MLP
        own.cell.mlps[1].layers[0].weight.mul_(-1.0)
    out_c, _ = own(x)
    assert (out_c - out_a).abs().max() > 1e-3


def test_shared_mlp_is_one_module_with_distinct_layers():
    cell = RelationalMemoryCell(**BASE, num_blocks=3, attention_mlp_layers=3)
    layers = cell.mlps[0].layers
    assert len(cell.mlps) == 1
    assert len({id(layer.weight) for layer in layers}) == 3  # not one repeated module
    assert len({id(block.qkv.weight) for block in cell.blocks}) == 3


# ---------------------------------------------------------------- `docs/rmc.md` §9.2


def _copy_gates_into_output_gate_model(default, gated):
    """Everything except the gate linears is shared; their first 2g rows come from default."""
    state = gated.state_dict()
    for key, value in default.state_dict().items():
        if "_gate." in key:
            state[key] = state[key].clone()
            state[key][: value.shape[0]] = value
        else:
            state[key] = value
    gated.load_state_dict(state)


@pytest.mark.parametrize("gate_style", ["unit", "memory"])
@pytest.mark.parametrize("input_rows", [None, 2], ids=["vector", "matrix2"])
def test_saturated_output_gate_reproduces_default_trajectory(gate_style, input_rows):
    default, gated = _pair(
        {},
        {"output_gate": True, "output_bias": math.inf},
        gate_style=gate_style,
        input_rows=input_rows,
        num_blocks=2,
    )
    perturb_(gated, seed=5)  # the output-gate columns are random and non-zero
    _copy_gates_into_output_gate_model(default, gated)
    g = gated.config.gate_size
    assert gated.cell.memory_gate.weight.shape[0] == 3 * g
    shape = (5, 2, 3) if input_rows is None else (5, 2, input_rows, 3)
    x = rand(*shape)
    s0 = gated.initial_state(2)
    close(s0.hidden, torch.tanh(s0.memory))  # h_0 = tanh(m_0)

    out_default, _ = default(x)
    state_d, state_g = default.initial_state(2), s0
    for t in range(x.shape[0]):
        y_d, state_d = default.cell(x[t], state_d)
        y_g, state_g, details = gated.cell(x[t], state_g, return_details=True)
        close(state_g.memory, state_d.memory)  # identical memory trajectory
        close(y_g, torch.tanh(state_d.memory).flatten(1))  # output = tanh(m_t)
        close(state_g.hidden, torch.tanh(state_g.memory))
        assert torch.equal(details.output_gate, torch.ones_like(details.output_gate))
    out_gated, final = gated(x)
    close(out_gated, torch.tanh(out_default))
    close(final.memory, state_d.memory)


def test_output_gate_changes_output_and_uses_hidden_state():
    torch.manual_seed(0)
    cell = RelationalMemoryCell(**BASE, output_gate=True, dtype=torch.float64)
    perturb_(cell)
    x = rand(2, 3)
    s0 = cell.initial_state(2)
    out, state, details = cell(x, s0, return_details=True)
    assert details.output_gate.shape == (2, 3, 4)
    close(out, (details.output_gate * torch.tanh(state.memory)).flatten(1))
    close(state.hidden.flatten(1), out)
    # The gates read h_{t-1}, not tanh(m_{t-1}): another hidden gives another memory.
    _, other = cell(x, RMCState(s0.memory, torch.zeros_like(s0.hidden)))
    assert (other.memory - state.memory).abs().max() > 1e-6


# ---------------------------------------------------------------- `docs/rmc.md` §9.4 and §2


@pytest.mark.parametrize("output_gate", [False, True], ids=["plain", "outgate"])
def test_trainable_gate_biases_start_at_constants_and_learn(output_gate):
    kwargs = {"forget_bias": 0.7, "input_bias": -0.4, "output_gate": output_gate}
    if output_gate:
        kwargs["output_bias"] = 0.25
    constant, trainable = _pair({}, {"trainable_gate_biases": True}, **kwargs)
    expected = [-0.4, 0.7, 0.25] if output_gate else [-0.4, 0.7]
    assert trainable.cell.gate_biases.tolist() == expected
    assert "cell.gate_biases" in trainable.state_dict()
    state = constant.state_dict()
    state["cell.gate_biases"] = trainable.cell.gate_biases.detach()
    trainable.load_state_dict(state)
    x = rand(4, 2, 3)
    out_a, _ = constant(x)
    out_b, _ = trainable(x)
    close(out_b, out_a)
    out_b.sum().backward()
    grad = trainable.cell.gate_biases.grad
    assert grad is not None and (grad != 0).all()
    # Changing a trainable bias changes the function; reset_parameters restores the constants.
    with torch.no_grad():
        trainable.cell.gate_biases.add_(0.5)
    assert (trainable(x)[0] - out_a).abs().max() > 1e-6
    trainable.reset_parameters()
    assert trainable.cell.gate_biases.tolist() == expected


def test_constant_gate_biases_are_not_parameters():
    cell = RelationalMemoryCell(**BASE, forget_bias=3.0, input_bias=-2.0)
    assert cell.gate_biases is None
    assert not any("gate_biases" in k for k in cell.state_dict())
    assert all(v.numel() > 1 or "bias" not in k for k, v in cell.state_dict().items())
    assert cell.config.forget_bias == 3.0 and cell.config.input_bias == -2.0
    assert cell.config.to_dict()["forget_bias"] == 3.0


def test_forget_and_input_bias_shift_the_gates():
    """The constants are added to the right halves: input first, forget second."""
    torch.manual_seed(0)
    base = RelationalMemoryCell(**BASE, dtype=torch.float64)
    x = rand(2, 3)
    _, _, d0 = base(x, return_details=True)
    shifted = RelationalMemoryCell(**BASE, dtype=torch.float64, forget_bias=3.0, input_bias=-2.0)
    shifted.load_state_dict(base.state_dict())
    _, _, d1 = shifted(x, return_details=True)
    logit = torch.logit
    close(logit(d1.input_gate), logit(d0.input_gate) - 2.0)
    close(logit(d1.forget_gate), logit(d0.forget_gate) + 2.0)  # default forget_bias is 1.0
