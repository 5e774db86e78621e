"""A one-layer ``nn.GRU`` over a whole sequence as one C++ operator on the CPU.

On the CPU ``nn.GRU`` steps through time in ATen: a GEMM, a chunk, two sigmoids, a tanh and
a few products a step, each a dispatch and, in training, an autograd node. At the reader's
sizes (32 rows of 48 to 96 units a direction, ``docs/performance.md`` §7.9) that bookkeeping is
most of its time. ``relmem_gru::sequence`` (``csrc/gru_sequence.cpp``) runs the same arithmetic
with the input's share as one GEMM over every step, the loop on raw pointers, and a
hand-written backward that forms the weights' and the input's gradients after the loop. Its
per-step GEMMs call MKL directly where torch carries it, through ATen otherwise or with
``RELMEM_DNC_ATEN_GEMM=1`` (the switch it shares with the DNC's sequence).

:func:`run_gru` is what callers use: ``module(x)[0]`` through the operator where it can run (a
one-layer, one-direction ``nn.GRU`` with biases from a zero state; float32 or float64 on the
CPU; outside autocast and tracing), through ``module`` itself everywhere else, and through
``module`` with one warning where the operator cannot be built. ``nn.GRU`` is the reference:
``tests/cores/test_gru_fused.py`` compares the two forward and backward and gradchecks the
operator.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
from torch import Tensor, nn

from relmem.cores import extension

_NAME = "relmem_gru_sequence"
_SOURCE = Path(__file__).with_name("csrc") / "gru_sequence.cpp"


def build_directory() -> Path:
    """Where the operator is built and cached (:func:`relmem.cores.extension.build_directory`)."""
    return extension.build_directory(_NAME, _SOURCE)


@functools.cache
def _build_failure() -> str | None:
    """Build and load the operator once per process: None, or why the build failed."""
    return extension.build(_NAME, _SOURCE, build_directory())


def unfused_reason(module: nn.GRU, x: Tensor) -> str | None:
    """Why ``module(x)`` cannot run the operator, or None. Tracing is the caller's check
    (``torch.compiler.is_compiling()`` read in the frame being traced)."""
    if module.num_layers != 1 or module.bidirectional or not module.bias:
        return "the fused GRU runs one layer, one direction, with biases"
    if getattr(module, "proj_size", 0):
        return "the fused GRU has no projection"
    if x.dim() != 3:
        return "the fused GRU reads batched input"
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
        return "the fused GRU runs float32 and float64 on the CPU"
    if module.weight_hh_l0.dtype != x.dtype or module.weight_hh_l0.device != x.device:
        return "its weights are not in the input's dtype and device"
    if torch.is_autocast_enabled("cpu"):
        return "under autocast"
    return None


def fused_gru(x: Tensor, module: nn.GRU) -> Tensor:
    """``module(x)[0]`` through ``relmem_gru::sequence``: ``x [T, B, X]`` (``[B, T, X]`` with
    ``module.batch_first``) -> the hidden at every step, ``[T, B, H]`` (``[B, T, H]``), from a
    zero state.

    Raises:
        RuntimeError: the operator could not be built (the compiler's reason).
    """
    failure = _build_failure()
    if failure is not None:
        raise RuntimeError(f"the fused GRU could not be built ({failure})")
    return torch.ops.relmem_gru.sequence(
        x,
        module.weight_ih_l0,
        module.weight_hh_l0,
        module.bias_ih_l0,
        module.bias_hh_l0,
        module.batch_first,
    )


_run_fused = torch.compiler.disable(fused_gru)


def run_gru(x: Tensor, module: nn.GRU) -> Tensor:
    """``module(x)[0]`` from a zero state, through the fused operator wherever it runs
    (module docstring) and through ``module`` elsewhere.

    Args:
        x: ``[T, B, X]``, or ``[B, T, X]`` with ``module.batch_first``.
        module: the ``nn.GRU`` whose weights are used.

    Returns:
        ``[T, B, H]`` (``[B, T, H]``), the hidden at every step.
    """
    if torch.compiler.is_compiling() or unfused_reason(module, x) is not None:
        return module(x)[0]
    failure = _build_failure()
    if failure is not None:
        extension.warn_once(
            f"the fused GRU could not be built ({failure}); nn.GRU runs instead", stacklevel=2
        )
        return module(x)[0]
    return _run_fused(x, module)
