"""``torch.compile(core, fullgraph=True)`` and ``torch.export`` on the RMC and the DNC.

``fullgraph=True`` fails on any graph break, so a passing compile is also the check that the
cores trace as one graph (E10's Python-side gradient bank and the ``lengths`` range check were
the breaks). The default run uses Dynamo's ``eager`` backend (tracing only, seconds); the slow
tests run AOT autograd (``aot_eager``) over every option and Inductor on one case per core.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from test_rmc_fast import BASE, CASES

from relmem.cores.dnc import DNC
from relmem.cores.rmc import RelationalMemory


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """One intra-op thread, and no compiled code or recompile budget carried between tests."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    torch.set_num_threads(threads)


def _leaves(state) -> list[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_leaves(state) if isinstance(t, torch.Tensor)]


def _run(module, inputs: torch.Tensor, lengths: torch.Tensor | None):
    """Outputs, final state and the gradients of inputs and parameters of a fixed loss."""
    module.zero_grad(set_to_none=True)
    inputs = inputs.detach().requires_grad_()
    output, state = module(inputs, lengths=lengths)
    loss = (output * torch.linspace(-1, 1, output.numel()).view_as(output)).sum()
    loss = loss + sum((t * t).sum() for t in _leaves(state))
    loss.backward()
    grads = [p.grad for p in module.parameters()]
    return [output, *_leaves(state), inputs.grad, *grads]


def _assert_compiled_matches_eager(core, inputs, backend: str, tol: float) -> None:
    """Compile ``core`` with ``fullgraph=True``; without and with ``lengths``, forward and
    backward, it matches the eager module."""
    eager = copy.deepcopy(core)
    compiled = torch.compile(core, fullgraph=True, backend=backend)
    batch = inputs.shape[1]
    for lengths in (None, torch.arange(batch) % inputs.shape[0] + 1):
        got, want = _run(compiled, inputs, lengths), _run(eager, inputs, lengths)
        assert len(got) == len(want)
        for index, (g, w) in enumerate(zip(got, want, strict=True)):
            assert g is not None and w is not None, index
            error = (g.double() - w.double()).norm().item() / max(w.double().norm().item(), 1e-30)
            assert math.isfinite(error) and error <= tol, f"tensor {index}: {error:.2e}"


def _rmc(case: str, dtype: torch.dtype = torch.float64) -> tuple[RelationalMemory, torch.Tensor]:
    torch.manual_seed(0)
    core = RelationalMemory(**{**BASE, **CASES[case]}, dtype=dtype)
    cfg = core.config
    rows = () if cfg.input_rows is None else (cfg.input_rows,)
    return core, torch.randn(3, 2, *rows, cfg.input_size, dtype=dtype)


def test_rmc_compiles_as_one_graph_forward_and_backward() -> None:
    """One slot at batch 2: in eager the fast path banks weight gradients (E10) here."""
    core, inputs = _rmc("one-slot-e7")
    _assert_compiled_matches_eager(core, inputs, "eager", 1e-12)


def test_rmc_exports_with_lengths() -> None:
    core, inputs = _rmc("default", torch.float32)
    lengths = torch.tensor([3, 1])
    program = torch.export.export(core, (inputs,), kwargs={"lengths": lengths})
    other = torch.tensor([2, 3])
    got, got_state = program.module()(inputs, lengths=other)
    want, want_state = core(inputs, lengths=other)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_state.memory, want_state.memory)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_rmc_every_option_compiles_through_aot_autograd(case: str) -> None:
    core, inputs = _rmc(case)
    _assert_compiled_matches_eager(core, inputs, "aot_eager", 1e-10)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_rmc_compiles_with_inductor() -> None:
    core, inputs = _rmc("output-gate", torch.float32)
    _assert_compiled_matches_eager(core, inputs, "inductor", 1e-5)


DNC_OPTIONS = {
    "default": {},
    "deepmind": {"compat": "deepmind"},
    "sparse-link": {"link": "sparse", "link_topk": 2},
    "extras": {
        "clip_value": 5.0,
        "usage_write_grad": True,
        "dealloc_content": True,
        "key_mask": True,
        "link_sharpness": True,
        "interface_clip": 3.0,
    },
    "two-layers-two-writers": {"num_layers": 2, "num_write_heads": 2},
}


def _dnc(options: dict, dtype: torch.dtype = torch.float64) -> tuple[DNC, torch.Tensor]:
    torch.manual_seed(0)
    return DNC(5, 8, 6, 4, 2, **options, dtype=dtype), torch.randn(3, 2, 5, dtype=dtype)


def test_dnc_compiles_as_one_graph_forward_and_backward() -> None:
    core, inputs = _dnc({})
    _assert_compiled_matches_eager(core, inputs, "eager", 1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(DNC_OPTIONS))
def test_dnc_every_option_compiles_through_aot_autograd(name: str) -> None:
    core, inputs = _dnc(DNC_OPTIONS[name])
    _assert_compiled_matches_eager(core, inputs, "aot_eager", 1e-10)


@pytest.mark.slow
@pytest.mark.timeout(3600)  # Inductor builds C++ kernels: over 10 minutes on a loaded 2-core VM
def test_dnc_compiles_with_inductor() -> None:
    core, inputs = _dnc({}, torch.float32)
    _assert_compiled_matches_eager(core, inputs, "inductor", 1e-5)


@pytest.mark.slow
def test_dnc_exports_with_lengths() -> None:
    core, inputs = _dnc({}, torch.float32)
    program = torch.export.export(core, (inputs,), kwargs={"lengths": torch.tensor([3, 1])})
    other = torch.tensor([2, 3])
    got = program.module()(inputs, lengths=other)[0]
    torch.testing.assert_close(got, core(inputs, lengths=other)[0])


def test_fast_wrapper_keeps_module_compile() -> None:
    """``FastRelationalMemory(compile=True)`` records its flag without hiding
    ``nn.Module.compile()`` (an attribute named ``compile`` made it a bool)."""
    from relmem.cores.rmc import FastRelationalMemory

    wrapper = FastRelationalMemory(RelationalMemory(**BASE), compile=True)
    assert wrapper.compile_step is True
    assert wrapper.compile.__func__ is torch.nn.Module.compile
