"""Every bad RMC input or constructor value raises an error naming the problem
(``docs/rmc.md`` §2, §12.3)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

from relmem import RelationalMemory, RelationalMemoryCell, RMCConfig, RMCState

BASE = {"input_size": 3, "mem_slots": 2, "head_size": 2, "num_heads": 2}


@pytest.fixture
def cell():
    torch.manual_seed(0)
    return RelationalMemoryCell(**BASE)


@pytest.fixture
def matrix_cell():
    torch.manual_seed(0)
    return RelationalMemoryCell(**BASE, input_rows=2)


@pytest.fixture
def core():
    torch.manual_seed(0)
    return RelationalMemory(**BASE)


# ---------------------------------------------------------------- constructor


CONSTRUCTOR_ERRORS = [
    ({"num_blocks": 0}, r"num_blocks must be an integer >= 1, got 0"),
    ({"num_blocks": -2}, r"num_blocks must be an integer >= 1, got -2"),
    ({"attention_mlp_layers": 0}, r"attention_mlp_layers must be an integer >= 1, got 0"),
    (
        {"gate_style": "per_slot"},
        r"gate_style must be 'unit', 'memory' or None, got 'per_slot'",
    ),
    ({"gate_style": "Unit"}, r"gate_style must be .*got 'Unit'"),
    ({"query_rows": "input"}, r"query_rows must be 'all' or 'memory', got 'input'"),
    ({"key_size": -1}, r"key_size must be None or an integer >= 0.*got -1"),
    ({"key_size": 2.0}, r"key_size must be None or an integer >= 0.*got 2\.0"),
    ({"key_size": True}, r"key_size must be None or an integer >= 0.*got True"),
    ({"gate_style": None, "output_gate": True}, r"output_gate=True needs gating"),
    ({"gate_style": None, "trainable_gate_biases": True}, r"trainable_gate_biases=True needs"),
    ({"forget_bias": math.nan}, r"forget_bias must be a float.*nan"),
    ({"input_bias": math.nan}, r"input_bias must be a float.*nan"),
    ({"output_bias": math.nan, "output_gate": True}, r"output_bias must be a float.*nan"),
    ({"mem_slots": 0}, r"mem_slots must be an integer >= 1, got 0"),
    ({"head_size": 0}, r"head_size must be an integer >= 1, got 0"),
    ({"num_heads": 0}, r"num_heads must be an integer >= 1, got 0"),
    ({"input_size": 0}, r"input_size must be an integer >= 1, got 0"),
    ({"input_rows": 0}, r"input_rows must be None .* or an integer >= 1.*got 0"),
    ({"num_heads": True}, r"num_heads must be an integer >= 1, got True"),
    ({"mem_slots": True}, r"mem_slots must be an integer >= 1, got True"),
    ({"num_blocks": True}, r"num_blocks must be an integer >= 1, got True"),
    ({"attention_mlp_layers": False}, r"attention_mlp_layers must be .*got False"),
    ({"input_rows": True}, r"input_rows must be None .*got True"),
    ({"head_size": 2.0}, r"head_size must be an integer >= 1, got 2\.0"),
]


@pytest.mark.parametrize(
    "bad,match",
    CONSTRUCTOR_ERRORS,
    ids=[",".join(f"{k}={v!r}" for k, v in bad.items()) for bad, _ in CONSTRUCTOR_ERRORS],
)
@pytest.mark.parametrize("cls", [RelationalMemoryCell, RelationalMemory, RMCConfig])
def test_constructor_rejects(cls, bad, match):
    with pytest.raises(ValueError, match=match):
        cls(**{**BASE, **bad})


@pytest.mark.parametrize("name", ["forget_bias", "input_bias", "output_bias"])
def test_config_rejects_bool_bias(name):
    with pytest.raises(ValueError, match=rf"{name} must be a float"):
        RMCConfig(**BASE, **{name: True})


@pytest.mark.parametrize("value", [math.inf, -math.inf, 0, 2.5])
def test_infinite_and_int_biases_are_allowed(value):
    cell = RelationalMemoryCell(
        **BASE, forget_bias=value, input_bias=-value, output_gate=True, output_bias=value
    )
    assert cell.config.forget_bias == value
    assert isinstance(cell.config.forget_bias, float)


def test_key_size_zero_means_head_size():
    cell = RelationalMemoryCell(**BASE, key_size=0)
    assert cell.config.resolved_key_size == BASE["head_size"]
    default = RelationalMemoryCell(**BASE)
    assert [p.shape for p in cell.parameters()] == [p.shape for p in default.parameters()]


# ---------------------------------------------------------------- step input


def test_cell_wrong_rank_vector(cell):
    with pytest.raises(ValueError, match=r"vector mode expects input \[B, F\] with F=3.*\(3,\)"):
        cell(torch.randn(3))


def test_cell_wrong_rank_matrix(matrix_cell):
    with pytest.raises(ValueError, match=r"matrix mode expects input \[B, n=2, F=3\].*\(4, 3\)"):
        matrix_cell(torch.randn(4, 3))


def test_cell_wrong_feature_size(cell):
    with pytest.raises(ValueError, match=r"expected input_size=3, got 4 features"):
        cell(torch.randn(2, 4))
    with pytest.raises(ValueError, match=r"expected input_size=3, got 6 features"):
        cell(torch.randn(2, 2, 3))  # vector mode flattens trailing dims: 6 != 3


def test_cell_wrong_feature_size_matrix(matrix_cell):
    with pytest.raises(ValueError, match=r"expected input_size=3, got 5 features per row"):
        matrix_cell(torch.randn(4, 2, 5))


def test_cell_wrong_row_count_matrix(matrix_cell):
    with pytest.raises(ValueError, match=r"n=2.*got shape \(4, 3, 3\)"):
        matrix_cell(torch.randn(4, 3, 3))


def test_cell_input_dtype_mismatch(cell):
    with pytest.raises(TypeError, match=r"input dtype torch.float64 differs from the parameters'"):
        cell(torch.randn(2, 3, dtype=torch.float64))


def test_cell_integer_input(cell):
    with pytest.raises(TypeError, match=r"floating-point.*torch.int64"):
        cell(torch.ones(2, 3, dtype=torch.long))


def test_cell_non_tensor_input(cell):
    with pytest.raises(TypeError, match=r"input must be a torch.Tensor, got list"):
        cell([[0.0, 1.0, 2.0]])


def test_cell_input_device_mismatch():
    meta_cell = RelationalMemoryCell(**BASE, device="meta")
    with pytest.raises(ValueError, match=r"input is on cpu but the module is on meta"):
        meta_cell(torch.randn(2, 3))


# ---------------------------------------------------------------- state


def test_state_batch_mismatch(cell):
    with pytest.raises(
        ValueError, match=r"state.memory batch size mismatch.*\[2, 2, 4\].*\[3, 2, 4\]"
    ):
        cell(torch.randn(2, 3), torch.zeros(3, 2, 4))


@pytest.mark.parametrize(
    "shape,match",
    [
        ((2, 3, 4), r"state.memory dim 1 mismatch: expected shape \[2, 2, 4\], got \[2, 3, 4\]"),
        ((2, 2, 5), r"state.memory dim 2 mismatch: expected shape \[2, 2, 4\], got \[2, 2, 5\]"),
        ((2, 2, 4, 1), r"state.memory must have shape \[2, 2, 4\], got \[2, 2, 4, 1\]"),
    ],
)
def test_state_shape_mismatch(cell, shape, match):
    with pytest.raises(ValueError, match=match):
        cell(torch.randn(2, 3), RMCState(torch.zeros(shape)))


def test_state_dtype_mismatch(cell):
    with pytest.raises(TypeError, match=r"state.memory has dtype torch.float64.*torch.float32"):
        cell(torch.randn(2, 3), torch.zeros(2, 2, 4, dtype=torch.float64))


def test_state_device_mismatch(cell):
    with pytest.raises(ValueError, match=r"state.memory is on meta but the module is on cpu"):
        cell(torch.randn(2, 3), torch.zeros(2, 2, 4, device="meta"))


def test_state_wrong_type(cell):
    with pytest.raises(TypeError, match=r"state must be an RMCState"):
        cell(torch.randn(2, 3), "memory")
    with pytest.raises(TypeError, match=r"state must be an RMCState"):
        cell(torch.randn(2, 3), (torch.zeros(2, 2, 4),) * 3)
    with pytest.raises(TypeError, match=r"state.memory must be a tensor"):
        cell(torch.randn(2, 3), RMCState(None))


def test_state_hidden_required_with_output_gate():
    cell = RelationalMemoryCell(**BASE, output_gate=True)
    with pytest.raises(ValueError, match=r"output_gate=True needs state.hidden"):
        cell(torch.randn(2, 3), torch.zeros(2, 2, 4))
    with pytest.raises(ValueError, match=r"state.hidden batch size mismatch"):
        cell(torch.randn(2, 3), RMCState(torch.zeros(2, 2, 4), torch.zeros(1, 2, 4)))


def test_state_hidden_rejected_without_output_gate(cell):
    with pytest.raises(ValueError, match=r"state.hidden must be None unless output_gate=True"):
        cell(torch.randn(2, 3), RMCState(torch.zeros(2, 2, 4), torch.zeros(2, 2, 4)))


def test_sequence_state_errors(core):
    x = torch.randn(4, 2, 3)
    with pytest.raises(ValueError, match=r"state.memory batch size mismatch"):
        core(x, torch.zeros(5, 2, 4))
    with pytest.raises(TypeError, match=r"state.memory has dtype torch.float64"):
        core(x, torch.zeros(2, 2, 4, dtype=torch.float64))


@pytest.mark.parametrize("batch_size", [0, -1, True, 2.0])
def test_initial_state_bad_batch_size(cell, batch_size):
    with pytest.raises(ValueError, match=r"batch_size must be an integer >= 1"):
        cell.initial_state(batch_size)


def test_numpy_integers_are_integers():
    """Sizes from a NumPy sweep (``np.int64``) are integers, stored as Python ints; they were
    refused as 'must be an integer, got np.int64(2)'."""
    core = RelationalMemory(np.int64(3), np.int64(2), np.int32(4), num_heads=np.int64(2))
    assert type(core.config.mem_slots) is int and core.config.mem_size == 8
    config = RMCConfig(3, 2, 4, key_size=np.int64(3), input_rows=np.int16(2))
    assert (type(config.key_size), type(config.input_rows)) == (int, int)
    assert core.cell.initial_state(np.int64(5)).memory.shape == (5, 2, 8)


# ---------------------------------------------------------------- sequence input


def test_sequence_wrong_rank(core):
    with pytest.raises(ValueError, match=r"rank >= 3 laid out as \[T, B, \.\.\.\].*\(4, 3\)"):
        core(torch.randn(4, 3))
    bf = RelationalMemory(**BASE, batch_first=True)
    with pytest.raises(ValueError, match=r"rank >= 3 laid out as \[B, T, \.\.\.\]"):
        bf(torch.randn(4, 3))


def test_sequence_wrong_rank_matrix():
    core = RelationalMemory(**BASE, input_rows=2)
    with pytest.raises(ValueError, match=r"rank >= 4.*\(4, 2, 3\)"):
        core(torch.randn(4, 2, 3))


def test_sequence_wrong_feature_size(core):
    with pytest.raises(ValueError, match=r"expected input_size=3, got 4 features"):
        core(torch.randn(4, 2, 4))


def test_sequence_wrong_row_count_matrix():
    core = RelationalMemory(**BASE, input_rows=2)
    with pytest.raises(ValueError, match=r"n=2"):
        core(torch.randn(4, 2, 3, 3))


def test_sequence_dtype_and_integer_input(core):
    with pytest.raises(TypeError, match=r"input dtype torch.float64 differs"):
        core(torch.randn(4, 2, 3, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"floating-point.*torch.int32"):
        core(torch.ones(4, 2, 3, dtype=torch.int32))


def test_sequence_non_tensor_input(core):
    with pytest.raises(TypeError, match=r"input must be a torch.Tensor or PackedSequence"):
        core([[[0.0, 1.0, 2.0]]])


def test_sequence_empty_axis(core):
    with pytest.raises(ValueError, match=r"empty time or batch axis"):
        core(torch.randn(0, 2, 3))
    with pytest.raises(ValueError, match=r"empty time or batch axis"):
        core(torch.randn(4, 0, 3))


@pytest.mark.parametrize(
    "lengths,match",
    [
        (torch.tensor([4, 4, 4]), r"lengths must have shape \[B\] = \[2\], got \(3,\)"),
        (torch.tensor([[4, 4]]), r"lengths must have shape \[B\] = \[2\], got \(1, 2\)"),
        (torch.tensor(4), r"lengths must have shape \[B\] = \[2\], got \(\)"),
        ([4, 5], r"every length must lie in 0\.\.T = 0\.\.4; got values from 4 to 5"),
        ([-1, 3], r"every length must lie in 0\.\.T = 0\.\.4; got values from -1 to 3"),
    ],
    ids=["too-long", "2d", "scalar", "above-T", "negative"],
)
def test_lengths_bad_value(core, lengths, match):
    with pytest.raises(ValueError, match=match):
        core(torch.randn(4, 2, 3), lengths=lengths)


@pytest.mark.parametrize(
    "lengths",
    [torch.tensor([4.0, 2.0]), [4.0, 2.0], torch.tensor([True, True])],
    ids=["float-tensor", "float-list", "bool"],
)
def test_lengths_not_integer(core, lengths):
    with pytest.raises(TypeError, match=r"lengths must be integers, got dtype torch\.(float|bool)"):
        core(torch.randn(4, 2, 3), lengths=lengths)


def test_packed_sequence_and_lengths_together(core):
    packed = pack_padded_sequence(torch.randn(4, 2, 3), torch.tensor([4, 2]))
    with pytest.raises(ValueError, match=r"either a PackedSequence or `lengths`, not both"):
        core(packed, lengths=torch.tensor([4, 2]))


@pytest.mark.parametrize("bias", ["forget_bias", "input_bias", "output_bias"])
@pytest.mark.parametrize("value", [True, "inf", float("nan")])
def test_modules_reject_non_float_bias_constants(bias, value):
    for module in (RelationalMemoryCell, RelationalMemory):
        with pytest.raises(ValueError, match=f"{bias} must be a float"):
            module(4, 2, 3, **{bias: value})


def test_sequence_errors_name_the_sequence_module_and_per_step_shape():
    core = RelationalMemory(5, 2, 3)
    with pytest.raises(ValueError, match=r"RelationalMemory \(each time step.*input_size=5.*6"):
        core(torch.randn(4, 2, 6))
