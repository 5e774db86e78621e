"""Sonnet initialisation, reset_parameters, factory kwargs and initial_state
(``docs/rmc.md`` §3, §4.8, §7)."""

from __future__ import annotations

import math

import pytest
import torch

from relmem import RelationalMemory, RelationalMemoryCell
from relmem.cores.rmc.reference import layer_norm_fp32

F_IN, N_ROWS, H, D = 40, 3, 4, 16
M = H * D


def build(**extra) -> RelationalMemoryCell:
    torch.manual_seed(0)
    kwargs = {
        "input_size": F_IN,
        "mem_slots": 2,
        "head_size": D,
        "num_heads": H,
        "num_blocks": 2,
        "input_rows": N_ROWS,
        "share_attention_mlp": False,
        **extra,
    }
    return RelationalMemoryCell(**kwargs)


def linears_with_fan_in(cell: RelationalMemoryCell):
    """(name, nn.Linear, the ``docs/rmc.md`` §7 fan_in) for every linear layer."""
    out = [("input_projection", cell.input_projection, F_IN)]
    out += [(f"blocks.{i}.qkv", b.qkv, M) for i, b in enumerate(cell.blocks)]
    out += [
        (f"mlps.{i}.layers.{j}", layer, M)
        for i, mlp in enumerate(cell.mlps)
        for j, layer in enumerate(mlp.layers)
    ]
    if cell.input_gate is not None:
        out += [("input_gate", cell.input_gate, N_ROWS * M), ("memory_gate", cell.memory_gate, M)]
    return out


def norms(cell: RelationalMemoryCell):
    return [n for b in cell.blocks for n in (b.qkv_norm, b.attention_norm, b.mlp_norm)]


def assert_sonnet_init(cell: RelationalMemoryCell) -> None:
    linears = linears_with_fan_in(cell)
    covered = {id(p) for _, lin, _ in linears for p in (lin.weight, lin.bias)}
    covered |= {id(p) for n in norms(cell) for p in (n.weight, n.bias)}
    covered |= {id(cell.gate_biases)} if cell.gate_biases is not None else set()
    assert covered == {id(p) for p in cell.parameters()}, "a parameter escaped the check"
    for name, lin, fan_in in linears:
        sigma = 1.0 / math.sqrt(fan_in)
        w = lin.weight.detach()
        assert w.abs().max() <= 2 * sigma + 1e-7, f"{name}: weight outside ±2σ"
        # A normal truncated at ±2σ has std 0.880σ; Kaiming-uniform (PyTorch's default,
        # U(±σ) here) would give 0.577σ and never exceed σ.
        if w.numel() >= 2000:
            assert 0.84 * sigma < w.std() < 0.92 * sigma, f"{name}: std {w.std() / sigma:.3f}σ"
            assert abs(float(w.mean())) < 0.1 * sigma, f"{name}: mean not ~0"
            assert (w.abs() > sigma).float().mean() > 0.15, f"{name}: looks uniform in ±σ"
        assert torch.equal(lin.bias, torch.zeros_like(lin.bias)), f"{name}: bias not zero"
    for layer_norm in norms(cell):
        assert layer_norm.eps == 1e-5
        assert torch.equal(layer_norm.weight, torch.ones_like(layer_norm.weight))
        assert torch.equal(layer_norm.bias, torch.zeros_like(layer_norm.bias))


@pytest.mark.parametrize("gate_style", ["unit", "memory", None])
def test_sonnet_initialisation(gate_style):
    assert_sonnet_init(build(gate_style=gate_style))


def test_sonnet_initialisation_sequence_module_and_output_gate():
    torch.manual_seed(0)
    core = RelationalMemory(
        input_size=F_IN,
        mem_slots=2,
        head_size=D,
        num_heads=H,
        input_rows=N_ROWS,
        output_gate=True,
    )
    assert_sonnet_init(core.cell)


def test_reset_parameters_redraws():
    cell = build(trainable_gate_biases=True, forget_bias=2.0)
    before = {k: v.clone() for k, v in cell.state_dict().items()}
    with torch.no_grad():
        for param in cell.parameters():
            param.fill_(0.37)
    cell.reset_parameters()
    assert_sonnet_init(cell)
    assert cell.gate_biases.tolist() == [0.0, 2.0]
    for key, value in cell.state_dict().items():
        if key.endswith("weight") and "norm" not in key:
            assert not torch.equal(value, before[key]), f"{key} was not re-drawn"
    # The same seed gives the same draw (the sequence module delegates to its cell).
    torch.manual_seed(3)
    a = RelationalMemory(input_size=4, mem_slots=2, head_size=4)
    torch.manual_seed(3)
    b = RelationalMemory(input_size=4, mem_slots=2, head_size=4)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(va, vb)
    torch.manual_seed(4)
    a.reset_parameters()
    assert not torch.equal(a.cell.input_projection.weight, b.cell.input_projection.weight)


@pytest.mark.parametrize("cls", [RelationalMemoryCell, RelationalMemory])
def test_dtype_factory_kwarg_float64(cls):
    torch.manual_seed(0)
    module = cls(
        input_size=3,
        mem_slots=2,
        head_size=2,
        num_heads=2,
        output_gate=True,
        trainable_gate_biases=True,
        dtype=torch.float64,
    )
    assert all(p.dtype == torch.float64 for p in module.parameters())
    state = module.initial_state(2)
    assert state.memory.dtype == torch.float64 and state.hidden.dtype == torch.float64
    x = torch.randn(2, 3, dtype=torch.float64)
    out, final = module(x if cls is RelationalMemoryCell else x[None])
    assert out.dtype == torch.float64 and final.memory.dtype == torch.float64


def test_meta_device_factory_kwarg():
    cell = RelationalMemoryCell(
        input_size=3, mem_slots=2, head_size=2, device="meta", trainable_gate_biases=True
    )
    assert all(p.device.type == "meta" for p in cell.parameters())
    state = cell.initial_state(4)
    assert state.memory.device.type == "meta" and state.memory.shape == (4, 2, 2)
    out, new_state = cell(torch.empty(4, 3, device="meta"))
    assert out.device.type == "meta" and out.shape == (4, 4)


def test_initial_state_honours_device_and_dtype():
    cell = RelationalMemoryCell(
        input_size=3, mem_slots=3, head_size=2, num_heads=2, output_gate=True
    )
    default = cell.initial_state(2)
    assert default.memory.dtype == torch.float32 and default.memory.device.type == "cpu"
    half = cell.initial_state(2, dtype=torch.float16)
    assert half.memory.dtype == torch.float16 and half.hidden.dtype == torch.float16
    assert torch.equal(half.memory.float(), default.memory)
    meta = cell.initial_state(2, device="meta", dtype=torch.float64)
    assert meta.memory.device.type == "meta" and meta.memory.dtype == torch.float64
    assert meta.hidden.device.type == "meta"
    assert cell.initial_state(2, device=torch.device("cpu")).memory.device.type == "cpu"
    # It follows the module after .to().
    cell.to(torch.float64)
    assert cell.initial_state(2).memory.dtype == torch.float64
    # Constant, no gradient, and a fresh tensor per call (safe to modify in place).
    a, b = cell.initial_state(2), cell.initial_state(2)
    assert not a.memory.requires_grad
    a.memory.add_(1.0)
    assert torch.equal(b.memory[0], torch.eye(3, 4, dtype=torch.float64))


def test_initial_state_sequence_module_delegates():
    core = RelationalMemory(input_size=3, mem_slots=3, head_size=2, num_heads=2)
    torch.testing.assert_close(core.initial_state(2).memory, core.cell.initial_state(2).memory)
    assert core.initial_state(1, dtype=torch.float64).memory.dtype == torch.float64


def test_layer_norm_in_fp32_for_bf16():
    """``docs/rmc.md`` §4.8: LN statistics in fp32 when the input is bf16/fp16."""
    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(8, eps=1e-5, dtype=torch.bfloat16)
    x32 = torch.randn(4, 8) * 30 + 1000  # large offset: bf16 statistics would be poor
    x16 = x32.to(torch.bfloat16)
    got = layer_norm_fp32(x16, norm)
    assert got.dtype == torch.bfloat16
    want = torch.nn.functional.layer_norm(x16.float(), (8,), eps=1e-5).to(torch.bfloat16)
    assert torch.equal(got, want)


def test_bfloat16_module_runs_close_to_float32():
    torch.manual_seed(0)
    cell = RelationalMemoryCell(input_size=3, mem_slots=2, head_size=4, num_heads=2)
    x = torch.randn(2, 3)
    out32, _ = cell(x)
    cell.to(torch.bfloat16)
    out16, state = cell(x.to(torch.bfloat16))
    assert out16.dtype == torch.bfloat16 and state.memory.dtype == torch.bfloat16
    torch.testing.assert_close(out16.float(), out32, rtol=5e-2, atol=5e-2)


def test_extra_repr_names_the_configuration():
    cell = RelationalMemoryCell(input_size=3, mem_slots=2, head_size=4, num_heads=2, key_size=5)
    text = repr(cell)
    for part in [
        "input_size=3",
        "mem_slots=2",
        "head_size=4",
        "num_heads=2",
        "key_size=5",
        "gate_style='unit'",
    ]:
        assert part in text
    assert "batch_first=True" in repr(
        RelationalMemory(input_size=3, mem_slots=2, head_size=4, batch_first=True)
    )
