"""The fused DNC memory step against the reference, forward and backward, states included.

The reference (``implementation='reference'``, the eager ops of ``docs/dnc.md``) is the oracle:
every option the operator runs is compared in float64 over several steps from a random valid
state, gradients of the interface and of every state field included; each module that runs
the memory (``DNCMemory``, ``DNCCell``, ``DNC``, ``MemoryControllerLayer``) is compared through
its parameters' gradients; and the operator's hand-written backward is gradchecked alone.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch.autograd import gradcheck
from torch.nn.utils.rnn import pack_padded_sequence

import relmem.cores.dnc.fused as fused_module
from relmem import DNC, DNCCell, MemoryControllerLayer
from relmem.cores import extension
from relmem.cores.dnc.controller import Controller
from relmem.cores.dnc.dnc import fused_recurrence, sequence_weights
from relmem.cores.dnc.memory import DNCMemory, DNCMemoryState

f64 = torch.float64

fused_module.load_dnc_ops()

OPTIONS = [
    {"compat": compat, "link": link, "num_write_heads": wh, "num_read_heads": r, **extra}
    for (compat, link, wh, r), extra in itertools.product(
        [
            ("paper", "dense", 1, 3),
            ("deepmind", "dense", 2, 2),
            ("paper", "none", 1, 1),
            ("deepmind", "none", 3, 2),
            ("paper", "dense", 3, 1),
        ],
        [
            {},
            {"usage_write_grad": True},
            {"interface_clip": 1.5},
            {"eps": 1e-3},
            {"dealloc_content": True},
            {"dealloc_content": True, "usage_write_grad": True},
            {"link_sharpness": True},
            {"link_sharpness": True, "dealloc_content": True, "interface_clip": 1.5},
            {"key_mask": True},
            {"key_mask": True, "link_sharpness": True, "dealloc_content": True},
        ],
    )
]


def _random_state(memory: DNCMemory, batch: int, seed: int) -> DNCMemoryState:
    """A valid state away from zero: usage in (0, 1), weights summing to at most 1, a link with
    a zero diagonal whose rows and columns sum to at most 1, leaves requiring gradients."""
    g = torch.Generator().manual_seed(seed)
    n, w = memory.memory_size, memory.word_size
    r, wh = memory.num_read_heads, memory.num_write_heads

    def weights(*shape: int) -> torch.Tensor:
        return 0.9 * torch.softmax(torch.randn(*shape, n, generator=g, dtype=f64), -1)

    link = precedence = None
    if memory.link == "dense":
        link = torch.rand(batch, wh, n, n, generator=g, dtype=f64) / n
        link = link * (1 - torch.eye(n, dtype=f64))
        precedence = weights(batch, wh)
    state = DNCMemoryState(
        memory=torch.randn(batch, n, w, generator=g, dtype=f64),
        usage=torch.rand(batch, n, generator=g, dtype=f64),
        link=link,
        precedence=precedence,
        read_weights=weights(batch, r),
        write_weights=weights(batch, wh),
        read_vectors=torch.randn(batch, r, w, generator=g, dtype=f64),
    )
    return DNCMemoryState._make(t if t is None else t.clone().requires_grad_(True) for t in state)


def _run_memory(memory: DNCMemory, interfaces: torch.Tensor, state: DNCMemoryState):
    """Steps over ``interfaces [T, B, I]``; a loss on every read and on the final state; the
    outputs, the final state and the gradients of the interfaces and the initial state."""
    reads, current = [], state
    for xi in interfaces:
        read, current = memory(xi, current)
        reads.append(read)
    g = torch.Generator().manual_seed(7)
    loss = sum((read * torch.randn(read.shape, generator=g, dtype=f64)).sum() for read in reads)
    for field in current:
        if field is not None:
            loss = loss + (field * torch.randn(field.shape, generator=g, dtype=f64)).sum()
    leaves = [interfaces] + [t for t in state if t is not None]
    grads = torch.autograd.grad(loss, leaves, allow_unused=True, materialize_grads=True)
    return reads, current, grads


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(f"{v}" for v in o.values()))
def test_the_fused_step_is_the_reference_forward_and_backward(options: dict) -> None:
    sizes = {"memory_size": 6, "word_size": 4, **options}
    reference = DNCMemory(None, **sizes, implementation="reference", dtype=f64)
    fused = DNCMemory(None, **sizes, implementation="fused", dtype=f64)
    # a large spread, so that the clip, the usage clamp and saturated gates are all reached
    interfaces = 3 * torch.randn(4, 3, reference.interface_size, dtype=f64)
    interfaces.requires_grad_(True)
    state = _random_state(reference, 3, seed=1)
    want = _run_memory(reference, interfaces, state)
    got = _run_memory(fused, interfaces, state)
    for a, b in zip(want[0], got[0], strict=True):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)
    for a, b in zip(want[1], got[1], strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)
    for a, b in zip(want[2], got[2], strict=True):
        torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize(
    "options",
    [
        {"compat": "paper", "link": "dense", "num_write_heads": 2, "num_read_heads": 2},
        {
            "compat": "deepmind",
            "link": "none",
            "num_write_heads": 1,
            "num_read_heads": 3,
            "usage_write_grad": True,
            "interface_clip": 1.0,
        },
        {
            "compat": "paper",
            "link": "dense",
            "num_write_heads": 2,
            "num_read_heads": 2,
            "usage_write_grad": True,
            "dealloc_content": True,
        },
        {
            "compat": "deepmind",
            "link": "dense",
            "num_write_heads": 2,
            "num_read_heads": 2,
            "usage_write_grad": True,
            "link_sharpness": True,
        },
        {
            "compat": "paper",
            "link": "none",
            "num_write_heads": 2,
            "num_read_heads": 2,
            "usage_write_grad": True,
            "key_mask": True,
        },
    ],
)
def test_the_operator_backward_passes_gradcheck(options: dict) -> None:
    memory = DNCMemory(None, 4, 3, **options, dtype=f64)
    state = _random_state(memory, 2, seed=3)
    xi = torch.randn(2, memory.interface_size, dtype=f64, requires_grad=True)
    empty = xi.new_empty(0)

    def step(xi, memory_, usage, link, precedence, read_weights, write_weights):
        return tuple(
            torch.ops.relmem_dnc.memory_step(
                xi,
                memory_,
                usage,
                link,
                precedence,
                read_weights,
                write_weights,
                memory.operator_offsets,
                memory.compat == "deepmind",
                memory.usage_write_grad,
                memory.dealloc_content,
                memory.interface_clip,
                memory.eps,
            )
        )

    link = state.link if state.link is not None else empty
    precedence = state.precedence if state.precedence is not None else empty
    inputs = (xi, state.memory, state.usage, link, precedence, state.read_weights)
    # the previous write weights reach the step through the usage only (usage_write_grad)
    write_weights = state.write_weights.detach().requires_grad_(memory.usage_write_grad)
    assert gradcheck(step, (*inputs, write_weights), eps=1e-6, atol=1e-7)


def _copy_of(module: torch.nn.Module, **kwargs) -> torch.nn.Module:
    """``module`` rebuilt with the reference step, sharing nothing."""
    other = type(module)(**kwargs, implementation="reference")
    other.load_state_dict(module.state_dict())
    return other


def _compare_modules(fused, reference, run) -> None:
    """``run(module)`` returns (output, loss); outputs and every parameter's gradient agree."""
    want, loss = run(reference)
    loss.backward()
    got, loss = run(fused)
    loss.backward()
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    for (name, a), (_, b) in zip(
        reference.named_parameters(), fused.named_parameters(), strict=True
    ):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-9, atol=1e-11, msg=name)


@pytest.mark.parametrize("compat", ["paper", "deepmind"])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize(
    "flags",
    [{}, {"dealloc_content": True}, {"link_sharpness": True}, {"key_mask": True}],
)
def test_dnc_and_its_cell_run_the_fused_step_exactly(compat: str, layers: int, flags) -> None:
    kwargs = {
        "input_size": 5,
        "hidden_size": 7,
        "memory_size": 6,
        "word_size": 4,
        "num_read_heads": 2,
        "num_layers": layers,
        "compat": compat,
        **flags,
        "dtype": f64,
    }
    torch.manual_seed(0)
    fused = DNC(**kwargs)
    reference = _copy_of(fused, **kwargs)
    x = torch.randn(6, 3, 5, dtype=f64)
    lengths = torch.tensor([6, 2, 4])

    def run(module):
        output, state = module(x, lengths=lengths)
        return output, output.square().sum() + state.memory.sum() + state.link.sum()

    _compare_modules(fused, reference, run)
    cell, cell_reference = fused.cell, reference.cell
    assert isinstance(cell, DNCCell)

    def run_cell(module):
        output, state = module(x[0])
        output, state = module(x[1], state)
        return output, output.sum() + state.usage.sum()

    fused.zero_grad()
    reference.zero_grad()
    _compare_modules(cell, cell_reference, run_cell)


@pytest.mark.parametrize("controller", ["gru", "lstm"])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("link", ["dense", "none"])
def test_the_memory_controller_layer_runs_the_fused_step_exactly(
    controller: str, bidirectional: bool, link: str
) -> None:
    kwargs = {
        "d_model": 6,
        "memory_slots": 5,
        "word_size": 3,
        "read_heads": 2,
        "controller": controller,
        "bidirectional": bidirectional,
        "link": link,
        "dtype": f64,
    }
    torch.manual_seed(0)
    fused = MemoryControllerLayer(**kwargs)
    reference = _copy_of(fused, **kwargs)
    x = torch.randn(7, 3, 6, dtype=f64)
    lengths = torch.tensor([7, 3, 5])

    def run(module):
        output, state = module(x, lengths=lengths)
        return output, output.square().sum() + state.memory.sum()

    _compare_modules(fused, reference, run)
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    got, _ = fused(packed)
    want, _ = reference(packed)
    torch.testing.assert_close(got.data, want.data, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "flags", [{}, {"dealloc_content": True, "key_mask": True, "link_sharpness": True}]
)
def test_float32_agrees_with_the_reference_to_rounding(flags) -> None:
    torch.manual_seed(0)
    sizes = {"input_size": 5, "hidden_size": 16, "memory_size": 16, "word_size": 8}
    fused = DNC(**sizes, num_read_heads=3, **flags)
    reference = _copy_of(fused, **sizes, num_read_heads=3, **flags)
    x = torch.randn(10, 4, 5)

    def run(module):
        output, _ = module(x)
        return output, output.square().sum()

    want, loss = run(reference)
    loss.backward()
    got, loss = run(fused)
    loss.backward()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for a, b in zip(reference.parameters(), fused.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-3, atol=1e-5)


def test_the_sequence_gives_the_same_numbers_with_its_gemms_through_aten() -> None:
    """Where torch carries MKL the sequence calls its GEMM entry points directly; elsewhere (and
    with RELMEM_DNC_ATEN_GEMM=1) the same products go through ATen. The module exactness tests
    above, again in a process that takes the ATen way."""
    assert torch.ops.relmem_dnc.direct_gemm() == torch.backends.mkl.is_available()
    selected = "dnc_and_its_cell_run_the_fused_step_exactly or layer_runs_the_fused_step_exactly"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k", selected],
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "RELMEM_DNC_ATEN_GEMM": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "24 passed" in result.stdout, result.stdout[-2000:]
    probe = "import relmem.cores.dnc.fused as f, torch; f.load_dnc_ops(); "
    probe += "print(torch.ops.relmem_dnc.direct_gemm())"
    said = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "RELMEM_DNC_ATEN_GEMM": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert said.stdout.strip() == "False", said.stdout + said.stderr[-2000:]


def test_the_default_is_the_fused_step_on_the_cpu() -> None:
    memory = DNCMemory(4, 6, 3)
    xi = torch.randn(2, memory.interface_size)
    assert memory.implementation == "auto" and memory.runs_fused(xi)
    assert not DNCMemory(4, 6, 3, implementation="reference").runs_fused(xi)


@pytest.mark.parametrize(
    ("option", "named"),
    [
        ({"link": "sparse", "link_topk": 2}, "link='sparse'"),
    ],
)
def test_an_option_it_does_not_run_keeps_the_reference_and_says_so_once(
    option: dict, named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(extension, "_SAID", set())
    memory = DNCMemory(None, 5, 3, **option, dtype=f64)
    reference = DNCMemory(None, 5, 3, **option, implementation="reference", dtype=f64)
    xi = torch.randn(2, memory.interface_size, dtype=f64)
    with pytest.warns(UserWarning, match=f"does not implement {named}.*reference step runs"):
        read, _ = memory(xi)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once
        memory(xi)
    torch.testing.assert_close(read, reference(xi)[0], rtol=0, atol=0)
    strict = DNCMemory(None, 5, 3, **option, implementation="fused")
    with pytest.raises(ValueError, match=f"implementation='fused', but .*{named}.*'reference'"):
        strict(torch.randn(2, strict.interface_size))


def test_a_failed_build_falls_back_to_the_reference_with_one_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(extension, "_SAID", set())
    monkeypatch.setattr(fused_module, "_build_failure", lambda: "c++: not found")
    memory = DNCMemory(4, 6, 3)
    x = torch.randn(2, 4)
    with pytest.warns(UserWarning, match=r"could not be built \(c\+\+: not found\)"):
        memory(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        memory(x)
    with pytest.raises(RuntimeError, match="c\\+\\+: not found.*ninja.*'reference'"):
        fused_module.load_dnc_ops()


def test_the_operator_names_a_bad_argument() -> None:
    memory = DNCMemory(None, 4, 3, dtype=f64)
    state = memory.initial_state(2)
    xi = torch.randn(2, memory.interface_size, dtype=f64)
    args = [
        xi,
        state.memory,
        state.usage,
        state.link,
        state.precedence,
        state.read_weights,
        state.write_weights,
        memory.operator_offsets,
        False,
        False,
        False,
        0.0,
        1e-6,
    ]
    bad = list(args)
    bad[2] = state.usage[:, :3]
    with pytest.raises(RuntimeError, match=r"usage must have shape \[2, 4\], got \[2, 3\]"):
        torch.ops.relmem_dnc.memory_step(*bad)
    bad = list(args)
    bad[1] = state.memory.float()
    with pytest.raises(RuntimeError, match="memory has dtype Float, the interface Double"):
        torch.ops.relmem_dnc.memory_step(*bad)
    bad = list(args)
    bad[7] = [0] * 10
    with pytest.raises(RuntimeError, match="offsets must hold 13 field offsets, got 10"):
        torch.ops.relmem_dnc.memory_step(*bad)
    bad = list(args)
    bad[7] = [10_000] * 13
    with pytest.raises(RuntimeError, match="lies outside the interface"):
        torch.ops.relmem_dnc.memory_step(*bad)


def test_no_second_derivative() -> None:
    memory = DNCMemory(4, 6, 3, dtype=f64)
    x = torch.randn(2, 4, dtype=f64, requires_grad=True)
    read, _ = memory(x)
    with pytest.raises(RuntimeError, match="no second derivative.*'reference'"):
        torch.autograd.grad(read.sum(), x, create_graph=True)


def test_inference_keeps_nothing_for_a_backward() -> None:
    memory = DNCMemory(4, 6, 3)
    with torch.no_grad():
        read, state = memory(torch.randn(2, 4))
    assert read.grad_fn is None and state.memory.grad_fn is None


def _sequence_args(lstm: bool, layers: int, link: str, seed: int = 0, **options):
    """A small controller and memory (with the memory's ``options``), their weights and a
    random valid state, in float64."""
    torch.manual_seed(seed)
    layer = MemoryControllerLayer(
        4, 5, 3, 2, controller="lstm" if lstm else "gru", link=link, dtype=f64
    )
    memory, controller = layer.memory, layer.controller
    if layers > 1:  # a deeper controller over the same input
        controller = Controller(
            4 + memory.read_size, 4, layers, "lstm" if lstm else "gru", dtype=f64
        )
    if layers > 1 or options:
        memory = DNCMemory(layers * 4, 5, 3, 2, link=link, **options, dtype=f64)
    state = _random_state(memory, 2, seed=seed)
    g = torch.Generator().manual_seed(seed)
    controller_state = [
        0.5 * torch.randn(2, 4, generator=g, dtype=f64) for _ in range(layers * (2 if lstm else 1))
    ]
    return memory, controller, state, controller_state


@pytest.mark.parametrize(
    ("lstm", "layers", "link", "clip", "forget_bias", "options"),
    [
        (True, 2, "dense", 0.6, 1.0, {}),
        (False, 1, "none", 0.0, 0.0, {}),
        (False, 2, "dense", 0.0, 0.0, {}),
        (False, 1, "dense", 0.0, 0.0, {"dealloc_content": True, "link_sharpness": True}),
        (True, 1, "dense", 0.0, 0.0, {"key_mask": True}),
    ],
)
def test_the_sequence_operator_passes_gradcheck(
    lstm, layers, link, clip, forget_bias, options
) -> None:
    memory, controller, state, controller_state = _sequence_args(lstm, layers, link, **options)
    weights = [w.detach().clone() for w in sequence_weights(memory, controller)]
    x = torch.randn(3, 2, 4, dtype=f64)
    lengths = torch.tensor([3, 1])
    fields = [state.memory, state.usage, state.link, state.precedence, state.read_weights,
              state.write_weights, state.read_vectors]  # fmt: skip
    present = [t for t in fields if t is not None]
    count = len(controller_state)

    def run(x, *tensors):
        ctrl = list(tensors[:count])
        rest = list(tensors[count:])
        mem = [rest.pop(0) if t is not None else None for t in fields]
        hiddens, reads, final_ctrl, final_mem = fused_module.sequence(
            x, lengths, ctrl, mem, rest, memory.operator_offsets, lstm=lstm, layers=layers,
            # usage_write_grad: with the gradient through the usage stopped (the default, as
            # deepmind's) the analytical gradient is not the derivative gradcheck measures
            forget_bias=forget_bias, clip=clip, deepmind=False, usage_write_grad=True,
            dealloc_content=memory.dealloc_content, interface_clip=0.0, eps=memory.eps,
        )  # fmt: skip
        return (hiddens, reads, *final_ctrl, *[t for t in final_mem if t is not None])

    inputs = [x, *controller_state, *present, *weights]
    for t in inputs:
        t.requires_grad_(True)
    assert gradcheck(run, tuple(inputs), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("controller", ["gru", "lstm"])
def test_finished_examples_carry_their_state_and_output_zeros(controller) -> None:
    """The operator against the layer's step-by-step loop, a loss on every hidden and read: a
    finished example's (the reference computes them and the modules mask them; the operator
    gives zeros, constant) and on the final state."""
    torch.manual_seed(0)
    layer = MemoryControllerLayer(4, 5, 3, 2, controller=controller, dtype=f64)
    x = torch.randn(5, 3, 4, dtype=f64, requires_grad=True)
    lengths = torch.tensor([5, 2, 0])
    state = layer.initial_state(3)
    g = torch.Generator().manual_seed(1)
    w_h, w_r = (
        torch.randn(5, 3, 4, generator=g, dtype=f64),
        torch.randn(5, 3, 6, generator=g, dtype=f64),
    )
    running = (torch.arange(5).unsqueeze(1) < lengths).unsqueeze(-1)  # [T, B, 1]
    results = []
    for run in ("reference", "fused"):
        if run == "reference":
            hiddens, reads, final = layer._reference_loop(x, state, lengths)
            hiddens, reads = hiddens * running, reads * running
        else:
            hiddens, reads, final = fused_recurrence(
                layer.memory, layer.controller, x, state, lengths
            )
        loss = (hiddens * w_h).sum() + (reads * w_r).sum() + final.memory.sum()
        loss = loss + final.controller[0][0].sum() if controller == "lstm" else loss
        grads = torch.autograd.grad(loss, [x, *layer.parameters()], allow_unused=True,
                                    materialize_grads=True)  # fmt: skip
        results.append((hiddens, reads, final.memory, final.usage, grads))
    for want, got in zip(*results, strict=True):
        for a, b in zip(want if isinstance(want, tuple) else [want],
                        got if isinstance(got, tuple) else [got], strict=True):  # fmt: skip
            torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-11)


def test_inference_runs_the_sequence_in_two_state_slots_with_the_same_numbers() -> None:
    torch.manual_seed(0)
    model = DNC(3, 8, 6, 4, 2, dtype=f64)
    x = torch.randn(7, 2, 3, dtype=f64)
    with torch.no_grad():
        quiet, quiet_state = model(x)
    loud, loud_state = model(x)
    assert quiet.grad_fn is None and loud.grad_fn is not None
    torch.testing.assert_close(quiet, loud.detach(), rtol=0, atol=0)
    torch.testing.assert_close(quiet_state.link, loud_state.link.detach(), rtol=0, atol=0)


def test_the_sequence_names_a_bad_argument() -> None:
    memory, controller, state, controller_state = _sequence_args(True, 1, "dense")
    weights = sequence_weights(memory, controller)
    fields = list(state)[:7]
    args = {"lstm": True, "layers": 1, "forget_bias": 0.0, "clip": 0.0, "deepmind": False,
            "usage_write_grad": False, "dealloc_content": False, "interface_clip": 0.0,
            "eps": 1e-6}  # fmt: skip
    x = torch.randn(3, 2, 4, dtype=f64)
    with pytest.raises(RuntimeError, match=r"every controller state must be \[B, H\]"):
        fused_module.sequence(x, None, [controller_state[0][:1], controller_state[1]], fields,
                              weights, memory.operator_offsets, **args)  # fmt: skip
    with pytest.raises(RuntimeError, match="expected 6 weights for 1 layers, got 5"):
        fused_module.sequence(x, None, controller_state, fields, weights[:5],
                              memory.operator_offsets, **args)  # fmt: skip
    with pytest.raises(RuntimeError, match=r"x must be \[T, B, X\]"):
        fused_module.sequence(x[0], None, controller_state, fields, weights,
                              memory.operator_offsets, **args)  # fmt: skip
