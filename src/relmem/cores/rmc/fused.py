"""The fused CPU path: :func:`recurrent_step`'s arithmetic with its small ops joined in C++.

On small cores the fast path's step is made of per-op overhead on small tensors, not
arithmetic (``docs/performance.md`` §4.1, §4.6): LayerNorms, a ``cat``, attention over a handful
of keys, gates and ``tanh``, each an eager op with its autograd node. ``implementation='fused'``
runs the same step with four C++ operators, each with a hand-written backward
(``csrc/fused_step.cpp``): ``attend_block`` (the qkv bias, LN_qkv, attention of the query rows
over the step's rows and the hoisted input rows without joining them, the residual and LN_attn),
``add_layer_norm`` (the MLP's last bias, its residual and LayerNorm), ``gate_update`` (the gates,
the blend and the output gate) and ``tanh`` (the recurrent input). The weight products stay ATen
GEMMs (without those two biases, so that no bias is copied into their outputs).

:func:`fused_sequence` calls the ``sequence`` operator, which runs a chunk of steps in a C++ loop,
GEMMs included; its backward runs the loop in reverse with the four operators' backward
functions, summing each weight's gradient over the steps inside its GEMM. One autograd node per
hoisting chunk instead of about ten per step (``docs/performance.md`` §4.9).
:func:`relmem.cores.rmc.fast.fast_sequence` still hoists E1–E3 and applies ``lengths``; E10
does not apply (the operator makes the weights' gradients itself). ``RelationalMemoryCell`` runs
its step as a sequence of one (:func:`relmem.cores.rmc.fast.fast_cell_step`), so one loop serves
both. The four step operators are registered on their own as well, so that the tests can
gradcheck each hand-written backward alone.

The reference remains the oracle: ``tests/cores/test_rmc_fast.py`` compares both entry points
with it over every option, forward and backward, states included.

The operators are compiled on first use (:mod:`relmem.cores.extension`: a C++ compiler and
``ninja`` are needed; the build is cached per Python and torch version and installation). CPU
only. ``implementation='auto'`` (the modules' default) runs them wherever they can run
(:func:`auto_fused`) and the fast path elsewhere.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
from torch import Tensor

from relmem.cores import extension
from relmem.cores.rmc.fast import SequenceFn, _Hoisted, _StepSpec, _StepWeights

_NAME = "relmem_fused_step"
_SOURCE = Path(__file__).with_name("csrc") / "fused_step.cpp"


def load_fused_ops() -> None:
    """Compile (once per installation and source) and load the fused step's operators.

    Raises:
        RuntimeError: the build failed, with the compiler's reason and the way out. A failed
            build is not retried in the same process.
    """
    failure = _build_failure()
    if failure is not None:
        raise RuntimeError(
            "implementation='fused' compiles a C++ extension on first use and could not build "
            f"it ({failure}). It needs a C++ compiler (g++) and the ninja package (pip install "
            "ninja); implementation='fast' runs the same arithmetic without it."
        )


def build_directory() -> Path:
    """Where the operators are built and cached (:func:`relmem.cores.extension.build_directory`)."""
    return extension.build_directory(_NAME, _SOURCE)


@functools.cache
def _build_failure() -> str | None:
    """Build and load the operators once per process: None, or why the build failed."""
    return extension.build(_NAME, _SOURCE, build_directory())


def unfused_reason(rows: Tensor) -> str | None:
    """Why the operators cannot run on the input ``rows``, with the way out, or None: input off
    the CPU (they are CPU kernels), a dtype other than float32 and float64, or a CPU autocast
    region. ``implementation='fast'`` runs all of these.

    Tracing is the callers' own check: dynamo compiles each Python frame it
    runs, so a frame that asks whether it is being compiled and returns the answer tells its
    eager caller, after a graph break, that it is."""
    if rows.device.type != "cpu":
        return (
            f"implementation='fused' runs on the CPU only, got input on {rows.device}; use "
            "implementation='fast' (or FastRelationalMemory's CUDA graphs) on a GPU"
        )
    if rows.dtype not in (torch.float32, torch.float64):
        return (
            f"implementation='fused' runs float32 and float64, got {rows.dtype} input; use "
            "implementation='fast' for half precision"
        )
    if torch.is_autocast_enabled("cpu"):
        return (
            "implementation='fused' does not run under CPU autocast (its operators are float32 "
            "and float64 kernels); use implementation='fast' there"
        )
    return None


def prepare_fused(rows: Tensor) -> SequenceFn:
    """:func:`fused_sequence` for the input ``rows``, its operators loaded.

    Raises:
        ValueError: the operators do not run on ``rows`` (:func:`unfused_reason`), or the call
            is being traced by ``torch.compile`` / ``torch.export`` / ``torch.jit`` (the
            operators have no fake-tensor kernel; without ``fullgraph=True`` dynamo then runs
            this call and :func:`fused_sequence` eagerly, between graphs).
        RuntimeError: the operators could not be built (:func:`load_fused_ops`).
    """
    reason = unfused_reason(rows)
    if reason is not None:
        raise ValueError(reason)
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        raise ValueError(
            "implementation='fused' cannot be traced by torch.compile, torch.export or "
            "torch.jit (its C++ operators have no fake-tensor kernel; without fullgraph=True a "
            "compiled model runs them between graphs); compile implementation='fast', which "
            "compiles with fullgraph=True"
        )
    load_fused_ops()
    return fused_sequence


def auto_fused(rows: Tensor) -> SequenceFn | None:
    """``implementation='auto'``'s step for ``rows``: :func:`fused_sequence` where the
    operators run on them, building them on the first call; None (the fast path) elsewhere,
    and where they could not be built, which is said once per process."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or unfused_reason(rows):
        return None  # tracing, off the CPU, half precision, autocast: the fast path's ground
    failure = _build_failure()
    if failure is None:
        return fused_sequence
    extension.warn_once(
        f"the RMC's fused CPU step could not be built ({failure}); implementation='auto' "
        "runs the fast path instead (the same arithmetic, slower on the CPU)",
        stacklevel=4,
    )
    return None


def step_for(implementation: str, rows: Tensor) -> SequenceFn | None:
    """The sequence function a core with ``implementation`` ('auto', 'fast' or 'fused') runs on
    the input ``rows``: :func:`fused_sequence`, or None for the fast path's own loop.

    Raises:
        ValueError, RuntimeError: ``'fused'`` cannot run there (:func:`prepare_fused`).
    """
    if implementation == "fused":
        return prepare_fused(rows)
    if implementation == "auto":
        return auto_fused(rows)
    return None


# Opaque to torch.compile: without fullgraph, a compiled model runs it eagerly between graphs
# (its C++ operators cannot be traced); prepare_fused refuses fullgraph with the way out.
@torch.compiler.disable
def fused_sequence(
    spec: _StepSpec,
    weights: _StepWeights,
    memory: Tensor,
    hidden: Tensor | None,
    hoisted: _Hoisted,
) -> tuple[Tensor, Tensor | None]:
    """:func:`relmem.cores.rmc.fast.recurrent_step` over a chunk of time as one operator with one
    backward (``relmem_fused::sequence``): the GEMMs run inside its loop, and each weight's
    gradient is summed over the steps inside its GEMM. A :data:`relmem.cores.rmc.fast.SequenceFn`.

    Args:
        spec: static sizes and options.
        weights: the in-loop tensors (``_step_weights``), not banked (E10 does not apply: the
            operator makes each weight's gradient itself).
        memory: ``[B, N, M]`` m before the chunk. hidden: ``[B, N, M]`` h, or None.
        hoisted: the chunk's input-only work, ``x [t, B, n, M]`` and the rest (E1–E3).

    Returns:
        ``(memories, hiddens)``: ``[t, B, N, M]`` each (hiddens None without ``output_gate``).
    """
    flat: list[Tensor] = []
    for block in weights.blocks:
        assert isinstance(block.qkv_w, Tensor)  # no banked weights (E10) on this path
        flat += [block.qkv_w, block.qkv_b, *block.qkv_ln, *block.attn_ln, *block.mlp_ln]
        for weight, bias in block.mlp:
            assert isinstance(weight, Tensor)
            flat += [weight, bias]
    if hoisted.gate_x is not None:
        assert isinstance(weights.gate_w, Tensor)
        flat.append(weights.gate_w)
    z_inputs = [z for z in hoisted.z_inputs if z is not None]
    outputs = torch.ops.relmem_fused.sequence(
        memory,
        hidden if spec.output_gate else None,
        hoisted.x,
        z_inputs,
        hoisted.gate_x,
        flat,
        [int(z is not None) for z in hoisted.z_inputs],
        spec.heads,
        spec.key,
        spec.value,
        spec.gate,
        spec.query_all,
        spec.output_gate,
        len(weights.blocks[0].mlp),
    )
    return outputs[0], outputs[1] if spec.output_gate else None
