"""Sonnet v1 variable conversion: names, shapes, round trip, and a forward pass computed
directly from Sonnet-named NumPy variables (TF layout) against the loaded PyTorch module."""

import numpy as np
import pytest
import torch

from relmem import RelationalMemory, RelationalMemoryCell
from relmem.sonnet import dump_variables, load_variables


def sonnet_names(num_blocks: int, mlp_layers: int, gated: bool = True) -> list[str]:
    """Creation-order names from ``docs/rmc.md`` §8, written out independently of the converter."""
    names = ["linear/w", "linear/b"]
    for j in range(1, num_blocks + 1):
        names += [f"linear_{j}/w", f"linear_{j}/b"]
        for offset in (0, 1):
            index = 3 * (j - 1) + offset
            ln = "layer_norm" if index == 0 else f"layer_norm_{index}"
            names += [f"{ln}/gamma", f"{ln}/beta"]
        if j == 1:
            for i in range(mlp_layers):
                names += [f"mlp/linear_{i}/w", f"mlp/linear_{i}/b"]
        names += [f"layer_norm_{3 * (j - 1) + 2}/gamma", f"layer_norm_{3 * (j - 1) + 2}/beta"]
    if gated:
        names += [f"linear_{num_blocks + 1}/w", f"linear_{num_blocks + 1}/b"]
        names += [f"linear_{num_blocks + 2}/w", f"linear_{num_blocks + 2}/b"]
    return names


def random_variables(cell: RelationalMemoryCell, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        name: rng.normal(size=value.shape).astype(np.float32)
        for name, value in dump_variables(cell).items()
    }


@pytest.mark.parametrize("num_blocks", [1, 2, 3])
@pytest.mark.parametrize("gate_style", ["unit", "memory", None])
def test_names_and_order_follow_spec(num_blocks, gate_style):
    cell = RelationalMemoryCell(15, 2, 4, 2, num_blocks=num_blocks, gate_style=gate_style)
    names = list(dump_variables(cell))
    assert names == sonnet_names(num_blocks, 2, gated=gate_style is not None)


def test_shapes_for_block_count_3_match_spec_count_1448():
    cell = RelationalMemoryCell(15, 2, 4, 2, num_blocks=3)
    variables = dump_variables(cell)
    assert sum(v.size for v in variables.values()) == 1448
    assert variables["linear/w"].shape == (15, 8)  # [F, M]
    assert variables["linear_1/w"].shape == (8, 24)  # [M, Q]
    assert variables["layer_norm_3/gamma"].shape == (24,)  # block 2's qkv LN
    assert variables["linear_4/w"].shape == (8, 16)  # gate from input [n·M, 2g]
    assert variables["linear_5/w"].shape == (8, 16)  # gate from memory [M, 2g]


@pytest.mark.parametrize("scope", ["", "relational_memory/"])
def test_round_trip_is_exact(scope):
    cell = RelationalMemoryCell(7, 3, 4, 2, num_blocks=2, key_size=3, input_rows=None)
    variables = {scope + k: v for k, v in random_variables(cell).items()}
    load_variables(cell, variables)
    dumped = dump_variables(cell, scope=scope)
    assert list(dumped) == list(variables)
    for name, value in variables.items():
        assert dumped[name].dtype == value.dtype
        np.testing.assert_array_equal(dumped[name], value)


def test_scope_suffix_and_optimizer_slots_are_accepted():
    cell = RelationalMemoryCell(5, 2, 3, 1)
    variables = random_variables(cell)
    decorated = {f"relational_memory/{k}:0": v for k, v in variables.items()}
    decorated["relational_memory/linear/w/Adam"] = np.zeros((5, 3), np.float32)
    decorated["relational_memory/linear/w/Adam_1:0"] = np.zeros((5, 3), np.float32)
    load_variables(cell, decorated)
    for name, value in dump_variables(cell).items():
        np.testing.assert_array_equal(value, variables[name])


def test_sequence_module_loads_too():
    core = RelationalMemory(5, 2, 3, 1)
    variables = random_variables(core.cell)
    load_variables(core, variables)
    np.testing.assert_array_equal(dump_variables(core)["linear/w"], variables["linear/w"])


def test_mismatch_lists_every_difference_and_writes_nothing():
    cell = RelationalMemoryCell(5, 2, 3, 1)
    before = {k: v.copy() for k, v in dump_variables(cell).items()}
    variables = random_variables(cell)
    del variables["layer_norm_1/beta"]
    variables["linear_7/w"] = np.zeros((3, 3), np.float32)
    variables["linear_1/w"] = np.zeros((4, 4), np.float32)
    with pytest.raises(ValueError) as info:
        load_variables(cell, variables)
    message = str(info.value)
    assert "missing: layer_norm_1/beta" in message
    assert "unexpected: linear_7/w" in message
    assert "shape of linear_1/w: expected [3, 9], got [4, 4]" in message
    for name, value in dump_variables(cell).items():
        np.testing.assert_array_equal(value, before[name])


def test_unsupported_variants_are_rejected():
    for kwargs, needle in [
        ({"share_attention_mlp": False, "num_blocks": 2}, "share_attention_mlp=False"),
        ({"output_gate": True}, "output_gate=True"),
        ({"trainable_gate_biases": True}, "trainable_gate_biases=True"),
    ]:
        cell = RelationalMemoryCell(5, 2, 3, 1, **kwargs)
        with pytest.raises(ValueError, match=needle):
            dump_variables(cell)


# ---------------------------------------------------------------------------------------------
# A forward pass written against the Sonnet variable dictionary (TF layout, x·w), following the
# TensorFlow code of Sonnet v1's RelationalMemory._build: it checks the converter's transposes,
# the head-major qkv split and the gate column order against the module.


def _sonnet_step(
    v,
    inputs,
    memory,
    num_heads,
    key_size,
    head_size,
    num_blocks,
    mlp_layers,
    forget_bias,
    input_bias,
    gate_size,
):
    def linear(name, x):
        return x @ v[f"{name}/w"] + v[f"{name}/b"]

    def layer_norm(index, x):
        name = "layer_norm" if index == 0 else f"layer_norm_{index}"
        mean = x.mean(-1, keepdims=True)
        var = x.var(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + 1e-5) * v[f"{name}/gamma"] + v[f"{name}/beta"]

    batch = inputs.shape[0]
    x = linear("linear", inputs.reshape(batch, -1))[:, None, :]  # [B, 1, M]
    h = np.concatenate([memory, x], axis=1)
    rows = h.shape[1]
    for j in range(1, num_blocks + 1):
        qkv = layer_norm(3 * (j - 1), linear(f"linear_{j}", h))
        qkv = qkv.reshape(batch, rows, num_heads, -1).transpose(0, 2, 1, 3)
        q = qkv[..., :key_size] * key_size**-0.5
        k = qkv[..., key_size : 2 * key_size]
        val = qkv[..., 2 * key_size :]
        logits = q @ k.transpose(0, 1, 3, 2)
        weights = np.exp(logits - logits.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        out = (weights @ val).transpose(0, 2, 1, 3).reshape(batch, rows, -1)
        h = layer_norm(3 * (j - 1) + 1, h + out)
        mlp = h
        for i in range(mlp_layers):
            mlp = linear(f"mlp/linear_{i}", mlp)
            if i < mlp_layers - 1:
                mlp = np.maximum(mlp, 0.0)
        h = layer_norm(3 * (j - 1) + 2, mlp + h)
    next_memory = h[:, :-1]
    gates = linear(f"linear_{num_blocks + 2}", np.tanh(memory))
    gates = gates + linear(f"linear_{num_blocks + 1}", x.reshape(batch, -1))[:, None, :]
    sigmoid = lambda z: 1.0 / (1.0 + np.exp(-z))  # noqa: E731
    input_gate = sigmoid(gates[..., :gate_size] + input_bias)
    forget_gate = sigmoid(gates[..., gate_size:] + forget_bias)
    return input_gate * np.tanh(next_memory) + forget_gate * memory


@pytest.mark.parametrize("gate_style", ["unit", "memory"])
def test_forward_matches_sonnet_layout_computation(gate_style):
    heads, head_size, key_size, blocks, slots = 2, 3, 5, 2, 3
    cell = RelationalMemoryCell(
        6,
        slots,
        head_size,
        heads,
        num_blocks=blocks,
        key_size=key_size,
        gate_style=gate_style,
        forget_bias=0.5,
        input_bias=-0.25,
        dtype=torch.float64,
    )
    variables = {k: v.astype(np.float64) for k, v in random_variables(cell, seed=3).items()}
    load_variables(cell, variables)
    rng = np.random.default_rng(4)
    inputs = rng.normal(size=(4, 2, 3))  # flattened to F = 6
    memory = rng.normal(size=(4, slots, heads * head_size))
    expected = _sonnet_step(
        variables,
        inputs,
        memory,
        heads,
        key_size,
        head_size,
        blocks,
        2,
        0.5,
        -0.25,
        cell.config.gate_size,
    )
    with torch.no_grad():
        output, state = cell(torch.from_numpy(inputs), torch.from_numpy(memory))
    np.testing.assert_allclose(state.memory.numpy(), expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(output.numpy(), expected.reshape(4, -1), rtol=1e-10, atol=1e-12)


def test_any_float_array_loads_and_a_bad_one_writes_nothing():
    """A big-endian array (as ``np.load`` returns from such a file) or a long double loads; the
    conversion used to fail on the last variable after the others had been written."""
    cell = RelationalMemoryCell(5, 2, 3, 1, dtype=torch.float64)
    variables = random_variables(cell)
    last = list(variables)[-1]
    swapped = {k: v.astype(v.dtype.newbyteorder(">")) for k, v in variables.items()}
    swapped[last] = variables[last].astype(np.longdouble)
    load_variables(cell, swapped)
    for name, value in dump_variables(cell).items():
        np.testing.assert_array_equal(value, variables[name].astype(np.float64))
    before = {k: v.copy() for k, v in dump_variables(cell).items()}
    broken = dict(variables, **{last: np.zeros(variables[last].shape, np.complex64)})
    with pytest.raises(ValueError, match=f"dtype of {last}: expected a float array"):
        load_variables(cell, broken)
    for name, value in dump_variables(cell).items():
        np.testing.assert_array_equal(value, before[name])


def test_an_outer_scope_is_named_and_taken():
    cell = RelationalMemoryCell(5, 2, 3, 1)
    variables = dump_variables(cell, scope="rnn/relational_memory/")
    with pytest.raises(ValueError, match="prefix 'rnn/relational_memory/': pass it as scope"):
        load_variables(cell, variables)
    load_variables(cell, variables, scope="rnn/")


def test_a_bfloat16_core_dumps_as_float32():
    cell = RelationalMemoryCell(5, 2, 3, 1).to(torch.bfloat16)
    dumped = dump_variables(cell)
    assert all(value.dtype == np.float32 for value in dumped.values())
    expected = cell.input_projection.weight.detach().float().T.numpy()
    np.testing.assert_array_equal(dumped["linear/w"], expected)
