"""How far a run of the RMC lands from a float64 run: one forward and backward with given
upstream gradients, everything it computes gathered by name, and relative errors.

Used by ``benchmarks/rmc_precision.py`` and by the fast path's bf16 tests
(``tests/cores/test_rmc_fast.py``); ``docs/performance.md`` §4.13.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from relmem.cores.rmc import RMCState


class Problem(NamedTuple):
    """One run's data, on any device and dtype (moved to the run's)."""

    inputs: Tensor  # [T, B, (n,) F]
    state: RMCState  # the initial state
    out_grad: Tensor  # [T, B, N·M], the upstream gradient of the outputs
    state_grad: tuple[Tensor | None, ...]  # of the final state's fields (None where absent)


class Autocast(nn.Module):
    """``core`` run under the autocast ``FastRelationalMemory(matmul_dtype=dtype)`` uses
    (on its parameters' device, no cast cache)."""

    def __init__(self, core: nn.Module, dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        self.core, self.dtype = core, dtype

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        device = next(self.core.parameters()).device.type
        with torch.autocast(device, dtype=self.dtype, cache_enabled=False):
            return self.core(*args, **kwargs)


def run_with_gradients(
    module: nn.Module, problem: Problem, device: torch.device | str, dtype: torch.dtype
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Run ``module`` on ``problem`` moved to ``device`` in ``dtype`` and back-propagate the
    problem's upstream gradients.

    Returns:
        ``(quantities, parameter_gradients)`` as float64 CPU tensors: ``output``, ``final
        <field>`` and ``initial <field> grad`` for each state field present, ``input grad``;
        and every parameter's gradient by name (a wrapper's ``core.`` prefix removed).
    """

    def put(t: Tensor | None, grad: bool = False) -> Tensor | None:
        if t is None:
            return None
        return t.detach().to(device, dtype, copy=True).requires_grad_(grad)

    inputs = put(problem.inputs, grad=True)
    state = RMCState(*(put(s, grad=True) for s in problem.state))
    module.zero_grad(set_to_none=True)
    output, final = module(inputs, state)
    loss = (output * put(problem.out_grad)).sum()
    for s, g in zip(final, problem.state_grad, strict=True):
        if s is not None:
            loss = loss + (s * put(g)).sum()
    loss.backward()
    quantities = {"output": output, "input grad": inputs.grad}
    for field, s, initial in zip(RMCState._fields, final, state, strict=True):
        if s is not None:
            quantities[f"final {field}"], quantities[f"initial {field} grad"] = s, initial.grad
    grads = {name.removeprefix("core."): p.grad for name, p in module.named_parameters()}

    def cpu64(found: dict[str, Tensor]) -> dict[str, Tensor]:
        return {k: v.detach().to("cpu", torch.float64) for k, v in found.items()}

    return cpu64(quantities), cpu64(grads)


def relative_errors(found: dict[str, Tensor], truth: dict[str, Tensor]) -> dict[str, float]:
    """``‖found − truth‖ / ‖truth‖`` for each name of ``truth``."""
    return {
        name: ((found[name] - want).norm() / want.norm().clamp_min(1e-30)).item()
        for name, want in truth.items()
    }
