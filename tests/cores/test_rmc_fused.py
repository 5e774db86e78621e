"""The fused step's C++ operators (``relmem.cores.rmc.fused``): each operator's backward by
``gradcheck``, that ``implementation='fused'`` really runs them, its errors, and
:func:`~relmem.cores.rmc.prefer_fused` (a training run's choice for 'auto' cores).

Its equivalence with the reference over every option, forward and backward, states included,
is in ``test_rmc_fast.py`` (the ``fused`` parameter of its comparisons).
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from pathlib import Path

import pytest
import torch
from torch.autograd import gradcheck
from torch.profiler import ProfilerActivity, profile

import relmem.cores.rmc.fused as fused_module
import relmem.cores.rmc.module as module_module
from relmem.cores import extension
from relmem.cores.rmc import RelationalMemory, RelationalMemoryCell, prefer_fused

fused_module.load_fused_ops()
OPS = torch.ops.relmem_fused


def _double(*shape: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64, generator=generator).requires_grad_()


@pytest.mark.parametrize(
    ("rows_y", "rows_z", "rows_q", "key", "value"),
    [(3, 1, 3, 3, 4), (3, 2, 5, 3, 4), (4, 0, 4, 3, 4), (4, 0, 2, 3, 4), (3, 1, 3, 9, 17)],
    ids=["memory-queries", "all-queries", "no-hoisted-rows", "fewer-queries", "vector-widths"],
)
def test_attend_block_gradients(
    rows_y: int, rows_z: int, rows_q: int, key: int, value: int
) -> None:
    """Narrow heads run the operator's scalar tails; K = 9 and D = 17 run its vector loops (8
    doubles a vector) and their tails."""
    g = torch.Generator().manual_seed(0)
    heads, batch = 2, 2
    q_width, m_width = heads * (2 * key + value), heads * value
    args = (
        _double(batch, rows_y, q_width, generator=g),
        _double(batch, rows_z, q_width, generator=g),
        _double(batch, rows_q, m_width, generator=g),
        _double(q_width, generator=g),
        _double(q_width, generator=g),
        _double(q_width, generator=g),
        _double(m_width, generator=g),
        _double(m_width, generator=g),
    )

    def attend(*tensors):
        return OPS.attend_block(*tensors, heads, key, value)

    assert gradcheck(attend, args)


def test_add_layer_norm_and_tanh_gradients() -> None:
    g = torch.Generator().manual_seed(1)
    for width in (5, 19):  # a scalar tail only; vectors of 8 doubles and a tail
        a, b = _double(2, 3, width, generator=g), _double(2, 3, width, generator=g)
        bias, gamma, beta = (_double(width, generator=g) for _ in range(3))
        assert gradcheck(OPS.add_layer_norm, (a, b, bias, gamma, beta))
    assert gradcheck(OPS.tanh, (_double(3, 7, generator=g),))
    x = torch.linspace(-20, 20, 101, dtype=torch.float64)
    torch.testing.assert_close(OPS.tanh(x), torch.tanh(x), rtol=0, atol=1e-15)


def test_float_transcendentals_within_a_few_ulp() -> None:
    """In float32 the operators compute σ and tanh from their own e^x: within 2e-7 of float64's
    values over the range, exact at ±inf (a closed gate stays closed), NaN kept."""
    x = torch.cat([torch.linspace(-100, 100, 200_001), torch.logspace(-30, 1, 1000)])
    x = torch.cat([x, -x])
    want = torch.tanh(x.double())
    assert (OPS.tanh(x).double() - want).abs().max().item() < 2e-7
    special = torch.tensor([math.inf, -math.inf, math.nan])
    torch.testing.assert_close(
        OPS.tanh(special), torch.tensor([1.0, -1.0, math.nan]), equal_nan=True
    )
    # σ through gate_update: pre = x, gate_x = 0, rows = 0, memory = 1 -> new memory = σ(f).
    pre = torch.stack([torch.zeros_like(x), x], dim=-1).view(1, -1, 2)
    sigma = OPS.gate_update(
        pre, torch.zeros(1, 2), torch.zeros(1, len(x), 1), torch.ones(1, len(x), 1), 1, False
    )[0].view(-1)
    assert (sigma.double() - torch.sigmoid(x.double())).abs().max().item() < 2e-7
    pre = torch.tensor([[[0.0, math.inf], [0.0, -math.inf]]])
    ends = OPS.gate_update(
        pre, torch.zeros(1, 2), torch.zeros(1, 2, 1), torch.ones(1, 2, 1), 1, False
    )[0]
    assert ends.view(-1).tolist() == [1.0, 0.0]


@pytest.mark.parametrize("gate", [1, 4], ids=["memory-gate", "unit-gate"])
@pytest.mark.parametrize("output_gate", [False, True])
@pytest.mark.parametrize("used", ["both", "memory", "hidden"])
def test_gate_update_gradients(gate: int, output_gate: bool, used: str) -> None:
    """Both outputs' gradients, and either alone (the other undefined in the backward)."""
    g = torch.Generator().manual_seed(2)
    width = (3 if output_gate else 2) * gate
    args = (
        _double(2, 3, width, generator=g),
        _double(2, width, generator=g),
        _double(2, 3, 4, generator=g),
        _double(2, 3, 4, generator=g),
    )

    def update(*tensors):
        memory, hidden = OPS.gate_update(*tensors, gate, output_gate)
        return {"both": (memory, hidden), "memory": memory, "hidden": hidden}[used]

    assert gradcheck(update, args)


def test_fused_implementation_runs_the_fused_operators() -> None:
    """'fused' is not the eager step under another name: a sequence, and a cell's step as a
    sequence of one, run the ``sequence`` operator, which calls the kernels directly."""
    core = RelationalMemory(5, 3, 4, num_heads=2, implementation="fused")
    inputs = torch.randn(3, 2, 5, requires_grad=True)
    for run in (lambda: core(inputs), lambda: core.cell(inputs[0])):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            output, state = run()
            (output.sum() + state.memory.sum()).backward()
        names = {event.key for event in prof.key_averages()}
        assert "relmem_fused::sequence" in names
        assert "relmem_fused::attend_block" not in names
        assert "aten::_scaled_dot_product_flash_attention_for_cpu" not in names


@pytest.mark.parametrize("grad", [True, False], ids=["training", "inference"])
def test_fused_sequence_keeps_tensors_only_for_a_backward(grad: bool) -> None:
    """With gradients the sequence saves its steps' tensors for its backward; without them
    (no_grad, or nothing that requires grad) it keeps none, so inference holds one step's."""
    core = RelationalMemory(5, 3, 4, num_heads=2, implementation="fused")
    core.requires_grad_(grad)
    inputs = torch.randn(6, 2, 5)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        output, _ = core(inputs)
    assert output.requires_grad == grad
    assert (len(saved) > 0) == grad
    if grad:  # the weights and, per step, the block's and the gate's tensors
        assert len(saved) > 6 * 10


def test_fused_refuses_a_second_derivative() -> None:
    """The hand-written backward passes are not differentiable: create_graph=True is refused
    with the way out, for the sequence operator and the step operators alike."""
    core = RelationalMemory(5, 3, 4, num_heads=2, implementation="fused")
    inputs = torch.randn(3, 2, 5, requires_grad=True)
    way_out = "no second derivative.*implementation='reference'"
    for output in (core(inputs)[0], core.cell(inputs[0])[0]):
        with pytest.raises(RuntimeError, match=way_out):
            torch.autograd.grad(output.sum(), inputs, create_graph=True)
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match=way_out):
        torch.autograd.grad(OPS.tanh(x).sum(), x, create_graph=True)


@pytest.mark.parametrize("case", ["bfloat16", "float16", "autocast"])
def test_fused_refuses_what_its_kernels_do_not_run(case: str) -> None:
    """Half-precision input and CPU autocast get the way out, not the dispatcher's
    '"relmem_tanh" not implemented for 'Half''; the cell and the sequence alike."""
    inputs = torch.randn(3, 2, 5)
    core = RelationalMemory(5, 3, 4, num_heads=2, implementation="fused")
    if case == "autocast":
        context = torch.autocast("cpu", dtype=torch.bfloat16)
        message = "autocast.*implementation='fast'"
    else:
        dtype = getattr(torch, case)
        core, inputs = core.to(dtype), inputs.to(dtype)
        context = contextlib.nullcontext()
        message = f"float32 and float64, got torch.{case}.*implementation='fast'"
    with context:
        for run in (lambda: core(inputs), lambda: core.cell(inputs[0])):
            with pytest.raises(ValueError, match=message):
                run()


def test_fused_refuses_other_devices() -> None:
    core = RelationalMemory(5, 3, 4, implementation="fused", device="meta")
    with pytest.raises(ValueError, match="CPU only.*implementation='fast'"):
        core(torch.empty(3, 2, 5, device="meta"))
    cell = RelationalMemoryCell(5, 3, 4, implementation="fused", device="meta")
    with pytest.raises(ValueError, match="CPU only"):
        cell(torch.empty(2, 5, device="meta"))


def test_build_failure_names_the_way_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """The error names the compiler's reason and the way out; a failed build is tried once."""
    from torch.utils import cpp_extension

    attempts = []

    def no_compiler(*args, **kwargs):
        attempts.append(args)
        raise RuntimeError("Error building extension: c++: not found")

    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    fused_module._build_failure.cache_clear()
    try:
        for _ in range(2):
            with pytest.raises(RuntimeError, match="c\\+\\+: not found.*ninja.*'fast'"):
                fused_module.load_fused_ops()
        assert len(attempts) == 1
    finally:
        monkeypatch.undo()
        fused_module._build_failure.cache_clear()
        fused_module.load_fused_ops()


def test_an_interrupted_build_does_not_hang_the_next(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """A build killed while compiling leaves torch's lock file, on which every later load
    waited forever, silently. The next load removes it, with a warning, under the build's own
    lock (an flock, held across the load, which a killed process cannot leave behind)."""
    from filelock import FileLock, Timeout
    from torch.utils import cpp_extension

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    directory = fused_module.build_directory()
    assert directory.parent == tmp_path and torch.__version__ in directory.name
    directory.mkdir()
    (directory / "lock").touch()  # what a SIGKILL during the compile leaves
    seen = []

    def load(**kwargs):
        other = FileLock(directory / "relmem-build.lock", timeout=0)
        with pytest.raises(Timeout):  # a second process would wait for this build
            other.acquire()
        seen.append((kwargs["build_directory"], (directory / "lock").exists()))

    monkeypatch.setattr(cpp_extension, "load", load)
    fused_module._build_failure.cache_clear()
    try:
        with pytest.warns(UserWarning, match="left by a build .* that was interrupted"):
            fused_module.load_fused_ops()
        assert seen == [(str(directory), False)]
    finally:
        monkeypatch.undo()
        fused_module._build_failure.cache_clear()
        fused_module.load_fused_ops()


def test_prefer_fused_switches_the_auto_cores_on_the_cpu() -> None:
    """Cores left on 'auto' take the fused step on the CPU; explicit choices, and every core
    off the CPU, are left as they are."""
    model = torch.nn.ModuleList(
        [
            RelationalMemory(5, 3, 4),
            RelationalMemoryCell(5, 3, 4),
            RelationalMemory(5, 3, 4, implementation="fast"),
            RelationalMemory(5, 3, 4, implementation="reference"),
        ]
    )
    assert prefer_fused(model, torch.device("cuda")) is None
    assert [core.implementation for core in model] == ["auto", "auto", "fast", "reference"]
    assert prefer_fused(model, torch.device("cpu")) is None  # built at import: no note
    assert [core.implementation for core in model] == ["fused", "fused", "fast", "reference"]
    assert model[0].cell.implementation == "fused"


def test_prefer_fused_keeps_the_fast_path_when_the_build_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_compiler() -> None:
        raise RuntimeError("implementation='fused' ... could not build it (c++: not found)")

    monkeypatch.setattr(module_module, "load_fused_ops", no_compiler)
    core = RelationalMemory(5, 3, 4)
    note = prefer_fused(core, torch.device("cpu"))
    assert note is not None and note.startswith("the RMC runs the fast path")
    assert "c++: not found" in note
    assert core.implementation == "auto"


def _fused_ran(module: torch.nn.Module, inputs: torch.Tensor) -> bool:
    """Whether ``module(inputs)``, forward and backward, called the fused ``sequence``
    operator."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        output, state = module(inputs)
        (output.float().sum() + state.memory.float().sum()).backward()
    return "relmem_fused::sequence" in {event.key for event in prof.key_averages()}


def test_auto_runs_the_fused_operators_where_they_run() -> None:
    """'auto' (the default) takes the fused step on float32 and float64 CPU input, the
    sequence and the cell alike, and the fast path, without a word, where the operators do not
    run: half precision, CPU autocast, and while torch.compile traces (fullgraph=True compiles
    the fast path whole)."""
    core = RelationalMemory(5, 3, 4, num_heads=2)
    assert core.implementation == "auto"
    inputs = torch.randn(3, 2, 5, requires_grad=True)
    for dtype in (torch.float32, torch.float64):
        core, x = core.to(dtype), inputs.to(dtype)
        assert _fused_ran(core, x) and _fused_ran(core.cell, x[0])
    core, x = core.float(), inputs.float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not _fused_ran(core, x)
    half = RelationalMemory(5, 3, 4, num_heads=2).to(torch.bfloat16)
    assert not _fused_ran(half, x.detach().to(torch.bfloat16))
    torch._dynamo.reset()
    output, final = torch.compile(core, fullgraph=True)(x)
    want, want_final = core(x)
    torch.testing.assert_close(output, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(final.memory, want_final.memory, rtol=1e-5, atol=1e-6)


def test_auto_runs_the_fast_path_when_the_build_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed build leaves 'auto' on the fast path with one warning per process naming the
    compiler's reason; the numbers are the fused step's up to rounding."""
    core = RelationalMemory(5, 3, 4, num_heads=2)
    inputs = torch.randn(3, 2, 5)
    want, _ = core(inputs)
    monkeypatch.setattr(fused_module, "_build_failure", lambda: "c++: not found")
    monkeypatch.setattr(extension, "_SAID", set())
    with pytest.warns(UserWarning, match=r"could not be built \(c\+\+: not found\).*fast path"):
        output, _ = core(inputs)
    torch.testing.assert_close(output, want, rtol=1e-5, atol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not _fused_ran(core.cell, inputs[0])


def test_fused_under_torch_compile() -> None:
    """fullgraph=True is refused with the way out ('fast' compiles whole); without it the
    operators run between graphs and the results are eager's."""
    core = RelationalMemory(5, 3, 4, num_heads=2, implementation="fused")
    inputs = torch.randn(4, 2, 5)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="cannot be traced.*implementation='fast'"):
        torch.compile(core, fullgraph=True)(inputs)
    torch._dynamo.reset()
    output, final = torch.compile(core)(inputs)
    want, want_final = core(inputs)
    # The hoisted work around the operators is compiled: rounding, not bitwise.
    torch.testing.assert_close(output, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(final.memory, want_final.memory, rtol=1e-5, atol=1e-6)


def test_ninja_is_found_beside_python_without_an_activated_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch looks for ninja on PATH alone: `.venv/bin/relmem`, the README's command, run
    without activating the environment on a machine without a system ninja, fell back from
    the fused step with "Ninja is required" though the ninja package was installed."""
    import ninja

    monkeypatch.setenv("PATH", "/usr/bin")
    monkeypatch.setattr(extension.shutil, "which", lambda name: None)
    extension.put_ninja_on_path()
    assert os.environ["PATH"].split(os.pathsep)[:2] == [ninja.BIN_DIR, "/usr/bin"]


def test_each_installation_builds_in_its_own_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two installations shared one build folder and rebuilt over each other (the build
    records its source's absolute path)."""
    here = fused_module.build_directory()
    monkeypatch.setattr(fused_module, "_SOURCE", Path("/elsewhere/csrc/fused_step.cpp"))
    assert fused_module.build_directory().parent == here.parent
    assert fused_module.build_directory() != here
