"""float64 ``torch.autograd.gradcheck`` of whole RMC steps and a short sequence."""

from __future__ import annotations

import pytest
import torch

from relmem import RelationalMemory, RelationalMemoryCell, RMCState

TINY = {"input_size": 2, "mem_slots": 2, "head_size": 2, "num_heads": 2, "dtype": torch.float64}


def _perturb_(module: torch.nn.Module) -> None:
    with torch.no_grad():
        for param in module.parameters():
            param.add_(0.1 * torch.randn_like(param))


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"gate_style": "memory", "num_blocks": 2, "key_size": 3},
        {"gate_style": None, "input_rows": 2, "query_rows": "memory", "num_blocks": 2},
    ],
    ids=["unit-b1", "memory-b2-K3", "none-matrix2-qmem-b2"],
)
def test_gradcheck_one_step_wrt_input_and_state(extra):
    torch.manual_seed(0)
    cell = RelationalMemoryCell(**TINY, **extra)
    _perturb_(cell)
    rows = extra.get("input_rows")
    shape = (2, 2) if rows is None else (2, rows, 2)
    u = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    m = torch.randn(2, *cell.state_size, dtype=torch.float64, requires_grad=True)

    def step(u, m):
        out, state = cell(u, RMCState(m))
        return out, state.memory

    assert torch.autograd.gradcheck(step, (u, m), eps=1e-6, atol=1e-6)


def test_gradcheck_one_step_output_gate_wrt_memory_and_hidden():
    torch.manual_seed(0)
    cell = RelationalMemoryCell(**TINY, output_gate=True, trainable_gate_biases=True)
    _perturb_(cell)
    u = torch.randn(2, 2, dtype=torch.float64, requires_grad=True)
    m = torch.randn(2, *cell.state_size, dtype=torch.float64, requires_grad=True)
    h = torch.randn(2, *cell.state_size, dtype=torch.float64, requires_grad=True)

    def step(u, m, h):
        out, state = cell(u, RMCState(m, h))
        return out, state.memory, state.hidden

    assert torch.autograd.gradcheck(step, (u, m, h), eps=1e-6, atol=1e-6)


def test_gradcheck_one_step_wrt_gate_biases_parameter():
    torch.manual_seed(0)
    cell = RelationalMemoryCell(**TINY, trainable_gate_biases=True)
    u = torch.randn(2, 2, dtype=torch.float64)

    def step(biases):
        return torch.func.functional_call(cell, {"gate_biases": biases}, (u,))[0]

    biases = torch.tensor([0.3, -0.2], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(step, (biases,), eps=1e-6, atol=1e-6)


def test_gradcheck_three_step_sequence_with_lengths():
    torch.manual_seed(0)
    core = RelationalMemory(**TINY, num_blocks=2)
    _perturb_(core)
    x = torch.randn(3, 2, 2, dtype=torch.float64, requires_grad=True)
    m = torch.randn(2, *core.state_size, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([3, 2])

    def run(x, m):
        out, state = core(x, RMCState(m), lengths=lengths)
        return out, state.memory

    assert torch.autograd.gradcheck(run, (x, m), eps=1e-6, atol=1e-6)
