"""The fused GRU sequence (``relmem_gru::sequence``) against ``nn.GRU``, its reference: forward
and backward in float64 and float32, both layouts, gradcheck of the operator alone, and where
``run_gru`` falls back to the module."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from relmem.cores import gru as gru_module
from relmem.cores.gru import fused_gru, run_gru


def _grads(output: torch.Tensor, wrt: list[torch.Tensor], weights: torch.Tensor):
    return torch.autograd.grad((output * weights).sum(), wrt)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize(("steps", "batch", "inputs", "hidden"), [(6, 3, 7, 5), (1, 1, 2, 3)])
def test_forward_and_backward_equal_nn_gru_in_float64(
    batch_first: bool, steps: int, batch: int, inputs: int, hidden: int
) -> None:
    torch.manual_seed(0)
    module = nn.GRU(inputs, hidden, batch_first=batch_first).double()
    with torch.no_grad():  # biases away from 0, so that a lost bias term shows
        for p in module.parameters():
            p.uniform_(-0.8, 0.8)
    shape = (batch, steps, inputs) if batch_first else (steps, batch, inputs)
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    want, got = module(x)[0], fused_gru(x, module)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-14)
    weights = torch.randn_like(want)
    wrt = [x, *module.parameters()]
    for a, b in zip(_grads(got, wrt, weights), _grads(want, wrt, weights), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-13)


def test_float32_agrees_with_nn_gru_to_rounding() -> None:
    torch.manual_seed(1)
    module = nn.GRU(24, 16, batch_first=True)
    x = torch.randn(4, 30, 24, requires_grad=True)
    want, got = module(x)[0], fused_gru(x, module)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    weights = torch.randn_like(want)
    wrt = [x, *module.parameters()]
    for a, b in zip(_grads(got, wrt, weights), _grads(want, wrt, weights), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_gradcheck_of_the_operator() -> None:
    torch.manual_seed(2)
    module = nn.GRU(4, 3).double()
    x = torch.randn(5, 2, 4, dtype=torch.float64, requires_grad=True)
    params = [p.detach().clone().requires_grad_(True) for p in module.parameters()]
    for batch_first in (False, True):
        assert torch.autograd.gradcheck(
            lambda x, *w, first=batch_first: torch.ops.relmem_gru.sequence(x, *w, first),
            (x, *params),
        )


def test_without_a_gradient_the_forward_is_the_same() -> None:
    torch.manual_seed(3)
    module = nn.GRU(6, 4).double()
    x = torch.randn(7, 3, 6, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(fused_gru(x, module), module(x)[0], rtol=0, atol=1e-14)


def test_no_second_derivative() -> None:
    module = nn.GRU(3, 2).double()
    x = torch.randn(4, 2, 3, dtype=torch.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match="no second derivative"):
        torch.autograd.grad(fused_gru(x, module).sum(), x, create_graph=True)


@pytest.mark.parametrize(
    ("argument", "change", "message"),
    [
        ("x", lambda x: x[0], "x must be \\[T, B, X\\]"),
        ("x", lambda x: x.float(), "weight_ih is Double where x is Float"),
        ("x", lambda x: x.long(), "x must be float32 or float64"),
        ("weight_ih", lambda w: w[:, :2], "weight_ih must be \\[3H, X\\] = \\[6, 3\\]"),
        ("weight_hh", lambda w: w[:5], "weight_hh must be \\[3H, H\\]"),
        ("bias_hh", lambda b: b[:4], "bias_hh must be \\[6\\]"),
    ],
)
def test_bad_arguments_are_named(argument, change, message) -> None:
    module = nn.GRU(3, 2).double()
    args = {
        "x": torch.randn(4, 2, 3, dtype=torch.float64),
        "weight_ih": module.weight_ih_l0,
        "weight_hh": module.weight_hh_l0,
        "bias_ih": module.bias_ih_l0,
        "bias_hh": module.bias_hh_l0,
    }
    args[argument] = change(args[argument])
    with pytest.raises(RuntimeError, match=message):
        torch.ops.relmem_gru.sequence(*args.values(), False)


def _fused_ran(module: nn.GRU, x: torch.Tensor) -> tuple[bool, torch.Tensor]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = run_gru(x, module)
    return "relmem_gru::sequence" in {e.key for e in prof.key_averages()}, out


def test_run_gru_takes_the_operator_where_it_runs_and_the_module_elsewhere() -> None:
    torch.manual_seed(4)
    x = torch.randn(5, 2, 3)
    plain = nn.GRU(3, 4)
    assert _fused_ran(plain, x)[0]
    assert _fused_ran(plain.double(), x.double())[0]
    for module, inputs in [
        (nn.GRU(3, 4, bidirectional=True), x),
        (nn.GRU(3, 4, num_layers=2), x),
        (nn.GRU(3, 4, bias=False), x),
        (nn.GRU(3, 4).bfloat16(), x.bfloat16()),
        (nn.GRU(3, 4), x[:, 0]),  # unbatched
    ]:
        ran, out = _fused_ran(module, inputs)
        assert not ran
        torch.testing.assert_close(out, module(inputs)[0])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ran, out = _fused_ran(plain.float(), x)
    assert not ran


def test_a_failed_build_warns_once_and_runs_the_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gru_module, "_build_failure", lambda: "c++: not found")
    monkeypatch.setattr(gru_module.extension, "_SAID", set())
    module = nn.GRU(3, 4)
    x = torch.randn(5, 2, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [run_gru(x, module) for _ in range(2)]
    assert [str(w.message) for w in caught] == [
        "the fused GRU could not be built (c++: not found); nn.GRU runs instead"
    ]
    torch.testing.assert_close(outs[0], module(x)[0], rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="could not be built \\(c\\+\\+: not found\\)"):
        fused_gru(x, module)


def test_the_same_numbers_with_its_gemms_through_aten() -> None:
    """Where torch carries MKL the loop calls its GEMM directly; with RELMEM_DNC_ATEN_GEMM=1
    (the switch the DNC's sequence shares, ``cores/csrc/blas_gemm.h``) through ATen: the
    float64 comparisons above again in a process that takes the ATen way."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
         "equal_nn_gru_in_float64 or gradcheck"],
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "RELMEM_DNC_ATEN_GEMM": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "5 passed" in result.stdout, result.stdout[-2000:]


def test_run_gru_exports_through_the_module() -> None:
    """Traced by ``torch.export`` (``is_compiling()``), ``run_gru`` runs ``nn.GRU``: the
    program holds no call of the operator (which has no fake kernel) and equals eager."""

    class Wrapped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gru = nn.GRU(3, 4, batch_first=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return run_gru(x, self.gru)

    module = Wrapped()
    x = torch.randn(2, 5, 3)
    program = torch.export.export(module, (x,))
    assert "relmem_gru" not in str(program.graph)
    torch.testing.assert_close(program.module()(x), module(x))
