"""DNCCell / DNC: invariances, nn.LSTM-shaped API, regressions of ``docs/dnc.md`` §16.3, errors."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import relmem
from relmem import DNC, DNCState, detach_state
from relmem.cores.base import map_state
from relmem.cores.dnc import DNCCell
from relmem.cores.dnc.addressing import sparse_link_to_dense
from relmem.cores.dnc.controller import Controller

f64 = torch.float64
CONFIGS = {
    "dense": {},
    "sparse": {"link": "sparse", "link_topk": 3},
    "none": {"link": "none"},
    "deep-2writes": {"num_layers": 2, "num_write_heads": 2},
    "deepmind": {"compat": "deepmind"},
    "options": {
        "key_mask": True,
        "link_sharpness": True,
        "dealloc_content": True,
        "interface_clip": 20.0,
        "usage_write_grad": True,
    },
}


def make(config: str = "dense", **overrides) -> DNC:
    torch.manual_seed(0)
    kwargs = {"memory_size": 5, "word_size": 3, "num_read_heads": 2, "output_size": 4}
    kwargs.update(CONFIGS[config])
    kwargs.update(overrides)
    return DNC(3, 8, dtype=f64, **kwargs)


def seq(steps: int = 5, batch: int = 3, size: int = 3, seed: int = 1) -> torch.Tensor:
    return torch.randn(steps, batch, size, generator=torch.Generator().manual_seed(seed), dtype=f64)


def assert_states_close(a: DNCState, b: DNCState) -> None:
    map_state(lambda x, y: torch.testing.assert_close(x, y), a, b)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_sequence_equals_loop_of_cells(config):
    model = make(config)
    x = seq()
    output, state = model(x)
    cell_state = None
    for t in range(x.shape[0]):
        out_t, cell_state = model.cell(x[t], cell_state)
        torch.testing.assert_close(output[t], out_t)
    assert_states_close(state, cell_state)


@pytest.mark.parametrize("config", ["dense", "sparse", "deep-2writes"])
def test_chunks_with_carried_state_and_batch_rows(config):
    model = make(config)
    x = seq(6)
    output, state = model(x)
    first, mid = model(x[:2])
    second, end = model(x[2:], mid)
    torch.testing.assert_close(torch.cat([first, second]), output)
    assert_states_close(end, state)
    # row i of the batch equals example i alone
    alone, alone_state = model(x[:, 1:2])
    torch.testing.assert_close(alone[:, 0], output[:, 1])
    torch.testing.assert_close(alone_state.memory[0], state.memory[1])


@pytest.mark.parametrize("config", ["dense", "sparse", "none"])
def test_lengths_freeze_state_and_zero_outputs(config):
    model = make(config)
    x = seq(6)
    lengths = torch.tensor([6, 2, 4])
    output, state = model(x, lengths=lengths)
    for b, length in enumerate(lengths.tolist()):
        alone, alone_state = model(x[:length, b : b + 1])
        torch.testing.assert_close(output[:length, b], alone[:, 0])
        assert (output[length:, b] == 0).all()
        map_state(lambda s, a, b=b: torch.testing.assert_close(s[b], a[0]), state, alone_state)
    # zero length: the initial state comes back unchanged
    _, state0 = model(x, lengths=torch.tensor([0, 6, 6]))
    map_state(lambda s, i: torch.testing.assert_close(s[0], i[0]), state0, model.initial_state(3))
    # a PackedSequence gives the same answer
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    packed_out, packed_state = model(packed)
    padded, _ = pad_packed_sequence(packed_out)
    torch.testing.assert_close(padded, output[: padded.shape[0]])
    assert_states_close(packed_state, state)


def test_batch_first_layout():
    model = make()
    x = seq()
    output, state = model(x)
    model.batch_first = True
    output_bf, state_bf = model(x.transpose(0, 1).contiguous())
    assert output_bf.shape == (3, 5, 4)
    torch.testing.assert_close(output_bf, output.transpose(0, 1))
    assert_states_close(state_bf, state)  # the state is batch-leading either way


def test_sparse_model_equals_dense_model_when_k_is_n():
    dense = make("dense")
    sparse = make("dense", link="sparse", link_topk=5)
    sparse.load_state_dict(dense.state_dict())
    x = seq(7)
    out_dense, state_dense = dense(x)
    out_sparse, state_sparse = sparse(x)
    torch.testing.assert_close(out_sparse, out_dense)
    torch.testing.assert_close(
        sparse_link_to_dense(state_sparse.link, state_sparse.link_index), state_dense.link
    )


@pytest.mark.parametrize("config", list(CONFIGS))
def test_gradients_reach_every_parameter_and_initial_state(config):
    model = make(config)
    x = seq(4).requires_grad_(True)
    state = map_state(
        lambda t: (t + 0.01).requires_grad_(True) if t.is_floating_point() else t,
        model.initial_state(3),
    )
    output, final = model(x, state)
    (output.sum() + final.memory.sum()).backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name
        assert torch.isfinite(parameter.grad).all(), name
    assert x.grad.abs().sum() > 0
    assert state.memory.grad.abs().sum() > 0 and state.read_vectors.grad.abs().sum() > 0
    assert state.controller[0][0].grad.abs().sum() > 0


@pytest.mark.parametrize("config", list(CONFIGS))
def test_float32_on_device_matches_float64(config, device):
    """The model in float32 on ``device`` against itself in float64 on the CPU: outputs, the
    final state and the gradients of the inputs, the initial memory and every parameter."""
    reference = make(config)
    model = copy.deepcopy(reference).to(device, torch.float32)
    runs = []
    for module, dtype, where in ((reference, f64, "cpu"), (model, torch.float32, device)):
        x = seq(5).to(where, dtype).requires_grad_(True)
        state = map_state(
            lambda t, dtype=dtype, where=where: (
                (t.to(where, dtype) + 0.01).requires_grad_(True)
                if t.is_floating_point()
                else t.to(where)
            ),
            reference.initial_state(3),
        )
        output, final = module(x, state)
        (output.sum() + final.memory.pow(2).sum() + final.read_vectors.sum()).backward()
        found = {"output": output, "final memory": final.memory, "final usage": final.usage}
        found |= {"input grad": x.grad, "initial memory grad": state.memory.grad}
        found |= {name: p.grad for name, p in module.named_parameters()}
        runs.append({k: v.detach().to("cpu", f64) for k, v in found.items()})
    for name, want in runs[0].items():
        got = runs[1][name]
        error = ((got - want).norm() / want.norm().clamp_min(1e-12)).item()
        assert error < 1e-4, f"{name}: relative error {error:.2e}"


def test_whole_cell_step_gradcheck():
    model = DNC(2, 3, memory_size=3, word_size=2, num_read_heads=1, output_size=2, dtype=f64)
    cell = model.cell
    _, state = model(seq(3, 1, 2))
    x = torch.randn(1, 2, dtype=f64, requires_grad=True)
    memory = state.memory.detach().requires_grad_(True)
    reads = state.read_vectors.detach().requires_grad_(True)

    def step(x, memory, reads):
        output, new = cell.step(x, state._replace(memory=memory, read_vectors=reads))
        return output, new.memory, new.link, new.controller[0][1]

    assert torch.autograd.gradcheck(step, (x, memory, reads))


def test_reads_of_step_t_reach_the_controller_at_t_plus_1():
    # the step in eager modules, whose controller a hook can watch (the fused sequence runs
    # the same arithmetic in one operator: tests/dnc/test_dnc_fused.py)
    model = make(implementation="reference")
    cell = model.cell
    state = cell.initial_state(2)
    _, state = cell(seq(1, 2)[0], state)
    seen = []
    hook = cell.controller.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    _, _ = cell(seq(1, 2, seed=3)[0], state)
    hook.remove()
    chi = seen[0]  # [B, X + R·W]
    assert chi.shape == (2, 3 + 2 * 3)
    torch.testing.assert_close(chi[:, 3:], state.read_vectors.flatten(1))
    assert state.read_vectors.abs().sum() > 0


def test_output_size_is_independent_of_input_size():
    model = DNC(7, 8, memory_size=4, word_size=2, num_read_heads=1, output_size=11)
    output, _ = model(torch.randn(3, 2, 7))
    assert output.shape == (3, 2, 11)
    assert DNC(7, 8, memory_size=4).output_size == 8  # default: the hidden size, as nn.LSTM


def test_initial_state_is_zero_deterministic_and_unshared():
    model = make("deep-2writes")
    a, b = model.initial_state(2), model.initial_state(2)
    map_state(lambda x, y: torch.testing.assert_close(x, y), a, b)
    for tensor in a:
        if isinstance(tensor, torch.Tensor):
            assert (tensor == 0).all()
    (h, c), _ = a.controller
    assert h.data_ptr() != c.data_ptr()
    assert a.controller[0][0].shape == (2, 8) and len(a.controller) == 2
    assert a.link.shape == (2, 2, 5, 5) and a.memory.dtype == f64


def test_state_is_usable_after_detach_for_truncated_bptt():
    model = make()
    state = None
    for chunk in seq(6).split(2):
        output, state = model(chunk, state)
        output.sum().backward()
        state = detach_state(state)
        assert not state.memory.requires_grad
    # without detaching, a second backward through the old graph fails as usual
    output, state = model(seq(2), state)
    output.sum().backward()
    output2, _ = model(seq(2), state)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        (output2.sum() + output.sum()).backward()


def test_to_moves_all_buffers_and_parameters():
    model = DNC(3, 4, memory_size=4, word_size=2, link="none").to(f64)
    tensors = list(model.parameters()) + list(model.buffers())
    assert tensors and all(t.dtype == f64 for t in tensors)
    state = model.initial_state(2)
    assert state.memory.dtype == f64
    output, _ = model(torch.randn(2, 2, 3, dtype=f64))
    assert output.dtype == f64
    memory_only = relmem.DNCMemory(None, 4, 2).to(f64)  # parameter-free: buffer carries dtype
    assert memory_only.initial_state(1).memory.dtype == f64


def test_deepmind_compat_forget_bias_and_clipping():
    model = make("deepmind")
    assert model.cell.clip_value == 20.0 and model.cell.controller.forget_bias == 1.0
    # the constant forget bias equals a +1 on the LSTMCell's forget slice
    controller = model.cell.controller
    plain = Controller(controller.input_size, 8, dtype=f64)
    plain.load_state_dict(controller.state_dict())
    with torch.no_grad():
        plain.cells[0].bias_ih[8:16] += 1.0
    plain.clip_value = controller.clip_value
    x = torch.randn(2, controller.input_size, dtype=f64)
    state = ((torch.randn(2, 8, dtype=f64), torch.randn(2, 8, dtype=f64)),)
    out_a, state_a = controller(x, state)
    out_b, state_b = plain(x, state)
    torch.testing.assert_close(out_a, out_b)
    torch.testing.assert_close(state_a, state_b)
    # clip_value clips the output
    clipped = make("dense", clip_value=0.01)
    output, _ = clipped(seq() * 100)
    assert output.abs().max() <= 0.01


def test_autocast_bfloat16_forward_backward():
    model = DNC(3, 8, memory_size=5, word_size=3, num_read_heads=2, output_size=4)
    x = torch.randn(4, 2, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        output, state = model(x)
    assert state.memory.dtype == torch.float32 and state.usage.dtype == torch.float32
    reference, _ = model(x)
    torch.testing.assert_close(output.float(), reference, atol=0.1, rtol=0.1)
    output.float().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_extra_repr_and_reset_parameters():
    model = make("sparse")
    text = repr(model)
    assert "link='sparse'" in text and "link_topk=3" in text and "batch_first=False" in text
    before = [p.detach().clone() for p in model.parameters()]
    model.reset_parameters()
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        ({"hidden_size": 0}, ValueError, "hidden_size must be an integer >= 1, got 0"),
        ({"output_size": -2}, ValueError, "output_size must be None or an integer >= 1"),
        ({"num_layers": 0}, ValueError, "num_layers must be an integer >= 1"),
        ({"clip_value": -1.0}, ValueError, "clip_value must be a float >= 0"),
        (
            {"memory_size": 4, "link": "sparse", "link_topk": 5},
            ValueError,
            "link_topk must be at most memory_size = 4, got 5",
        ),
        ({"compat": "tf"}, ValueError, "compat must be one of 'paper', 'deepmind', got 'tf'"),
        ({"memory_size": 0}, ValueError, "memory_size must be an integer >= 1, got 0"),
        ({"num_read_heads": 0}, ValueError, "num_read_heads must be an integer >= 1, got 0"),
        ({"link": "full"}, ValueError, "link must be one of 'dense', 'sparse', 'none'"),
        ({"interface_clip": -1.0}, ValueError, "interface_clip must be a float >= 0"),
        ({"eps": 0.0}, ValueError, r"eps must be a float in \(0, 0.1\), got 0.0"),
        ({"key_mask": 1}, TypeError, "key_mask must be True or False, got 1"),
    ],
)
def test_bad_options_raise_clear_errors(kwargs, error, message):
    args = {"input_size": 3, "hidden_size": 8, **kwargs}
    # the memory's options are named as the cell's, not as the DNCMemory inside
    with pytest.raises(error, match="^DNCCell: " + message):
        DNC(**args)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"input_size": 0}, "input_size must be an integer >= 1, got 0"),
        ({"hidden_size": 0}, "hidden_size must be an integer >= 1, got 0"),
        ({"num_layers": 0}, "num_layers must be an integer >= 1, got 0"),
        ({"clip_value": -1.0}, "clip_value must be a float >= 0 \\(0 disables it\\)"),
        ({"forget_bias": float("nan")}, "forget_bias must be a float, got nan"),
    ],
)
def test_controller_checks_its_arguments(kwargs, message):
    args = {"input_size": 5, "hidden_size": 4, **kwargs}
    with pytest.raises(ValueError, match="^Controller: " + message):
        Controller(**args)


def test_bad_inputs_raise_clear_errors():
    model = DNC(3, 8, memory_size=4, word_size=2)
    # the sequence's shape as passed, not one step's, and the module that was called
    message = r"DNC: expected input_size=3 features per step \(the last axis\), got input of "
    message += r"shape \(4, 2, 5\)"
    with pytest.raises(ValueError, match=message):
        model(torch.randn(4, 2, 5))
    with pytest.raises(
        ValueError, match=r"DNCCell: expected input \[B, input_size=3\], got shape \(2, 5\)"
    ):
        model.cell(torch.randn(2, 5))
    with pytest.raises(ValueError, match=r"rank >= 3"):
        model(torch.randn(4, 3))
    with pytest.raises(TypeError, match="input dtype torch.float64 differs"):
        model(torch.randn(4, 2, 3, dtype=f64))
    with pytest.raises(TypeError, match="floating-point"):
        model(torch.ones(4, 2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"lengths must have shape \[B\] = \[2\]"):
        model(torch.randn(4, 2, 3), lengths=[4])
    with pytest.raises(ValueError, match=r"every length must lie in 0..T = 0..4"):
        model(torch.randn(4, 2, 3), lengths=[4, 5])
    state = model.initial_state(2)
    with pytest.raises(ValueError, match="state.memory batch size mismatch"):
        model(torch.randn(4, 3, 3), state)
    with pytest.raises(TypeError, match="state must be a DNCState"):
        model(torch.randn(4, 2, 3), state.memory_state)
    bad = state._replace(controller=((state.controller[0][0],),))
    with pytest.raises(ValueError, match=r"state.controller\[0\] must be an \(h, c\) pair"):
        model(torch.randn(4, 2, 3), bad)
    bad = state._replace(controller=((state.controller[0][0][:, :3], state.controller[0][1]),))
    with pytest.raises(ValueError, match=r"state.controller\[0\].h dim 1 mismatch"):
        model(torch.randn(4, 2, 3), bad)
    with pytest.raises(TypeError, match="input must be a torch.Tensor"):
        model.cell([[1.0, 2.0, 3.0]])


def test_sequence_module_takes_the_cells_arguments_and_its_own() -> None:
    """``DNC``'s signature is ``DNCCell``'s with ``batch_first`` after the positional ones and
    ``recompute_steps`` last."""

    cell = list(inspect.signature(DNCCell).parameters)
    names = list(inspect.signature(DNC).parameters)
    assert names == [*cell[:6], "batch_first", *cell[6:], "recompute_steps"]
    model = DNC(3, 8, 4, 2, 1, 1, True, output_size=5, recompute_steps=7)
    assert model.batch_first and model.output_size == 5 and model.cell.memory.memory_size == 4
    assert model.recompute_steps == 7 and DNC(3, 8).recompute_steps is None
    with pytest.raises(TypeError, match="DNC: got an unexpected keyword argument 'bogus'"):
        DNC(3, 8, bogus=1)
