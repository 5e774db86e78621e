"""The DNC's fused CPU path: the memory step, and the whole recurrence, as C++ operators.

The reference step (:mod:`relmem.cores.dnc.memory`, :mod:`relmem.cores.dnc.addressing`) is
about a hundred small eager ops per token, each with its autograd node; at the sizes the DNC
runs at (N of 16 to 128 slots, words of 16 to 64), their per-call cost is the whole step
(``docs/performance.md`` §7, ``docs/dnc.md`` §17). ``relmem_dnc::memory_step``
(``csrc/memory_step.cpp``) runs the same arithmetic, from the raw interface vector to the read
vectors, as a few loops per example with a hand-written backward: one autograd node per step.
``relmem_dnc::sequence`` (:func:`sequence`) runs the controller, the interface GEMM and that
step over a chunk of time with one autograd node.

What it runs: the link 'dense' or 'none', compat 'paper' or 'deepmind', any number of read and
write heads, and every option (``usage_write_grad``, ``dealloc_content``, ``key_mask``,
``link_sharpness``, ``interface_clip``, ``eps``); float32 and float64 on the CPU. The sparse link
runs the reference step
(``DNCMemory.unfused_reason`` says why, once). The reference stays the oracle:
``tests/dnc/test_dnc_fused.py`` compares the two forward and backward, states included, over
every option, and gradchecks the operator alone.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from relmem.cores import extension

_NAME = "relmem_dnc_step"
_SOURCE = Path(__file__).with_name("csrc") / "memory_step.cpp"

# The interface fields in the operator's order (its enum Field).
OPERATOR_FIELDS = (
    "read_keys",
    "read_strengths",
    "write_keys",
    "write_strengths",
    "erase_vectors",
    "write_vectors",
    "free_gates",
    "allocation_gates",
    "write_gates",
    "read_modes",
    "sharpness",
    "read_masks",
    "write_masks",
)


def build_directory() -> Path:
    """Where the operator is built and cached (:func:`relmem.cores.extension.build_directory`)."""
    return extension.build_directory(_NAME, _SOURCE)


@functools.cache
def _build_failure() -> str | None:
    """Build and load the operator once per process: None, or why the build failed."""
    return extension.build(_NAME, _SOURCE, build_directory())


def load_dnc_ops() -> None:
    """Compile (once per installation and source) and load the fused memory step.

    Raises:
        RuntimeError: the build failed, with the compiler's reason and the way out.
    """
    failure = _build_failure()
    if failure is not None:
        raise RuntimeError(
            "the DNC's fused memory step compiles a C++ extension on first use and could not "
            f"build it ({failure}). It needs a C++ compiler (g++) and the ninja package (pip "
            "install ninja); implementation='reference' runs the same arithmetic without it."
        )


def elsewhere_reason(interface: Tensor) -> str | None:
    """Why this call cannot run the operator: off the CPU or traced by ``torch.compile``."""
    if interface.device.type != "cpu":
        return f"the fused DNC memory step runs on the CPU only, got input on {interface.device}"
    if torch.compiler.is_compiling():
        return "the fused DNC memory step cannot be traced by torch.compile (no fake kernel)"
    return None


def build_reason() -> str | None:
    """Why the operator could not be built (the first call builds it), or None."""
    failure = _build_failure()
    return None if failure is None else f"the fused DNC memory step could not be built ({failure})"


def say_once(reason: str) -> None:
    """Warn that the reference step runs, once per process and reason."""
    extension.warn_once(f"{reason}; the reference step runs instead", stacklevel=4)


@torch.compiler.disable
def memory_step(
    interface: Tensor,
    state: Sequence[Tensor | None],
    offsets: list[int],
    deepmind: bool,
    usage_write_grad: bool,
    dealloc_content: bool,
    clip: float,
    eps: float,
) -> list[Tensor | None]:
    """One memory step as ``relmem_dnc::memory_step``.

    Args:
        interface: ``[B, I]`` raw ξ, float32 or float64 on the CPU.
        state: ``(memory [B, N, W], usage [B, N], link [B, Wh, N, N] or None, precedence
            [B, Wh, N] or None, read_weights [B, R, N], write_weights [B, Wh, N])`` in the
            interface's dtype.
        offsets: where each of :data:`OPERATOR_FIELDS` starts in ξ (-1: absent).
        deepmind, usage_write_grad, dealloc_content, clip, eps: the memory's options.

    Returns:
        The new ``(memory, usage, link, precedence, read_weights, write_weights,
        read_vectors [B, R, W])``; link and precedence None without a link.
    """
    memory, usage, link, precedence, read_weights, write_weights = state
    empty = interface.new_empty(0)
    out = torch.ops.relmem_dnc.memory_step(
        interface,
        memory,
        usage,
        empty if link is None else link,
        empty if precedence is None else precedence,
        read_weights,
        write_weights,
        offsets,
        deepmind,
        usage_write_grad,
        dealloc_content,
        clip,
        eps,
    )
    has_link = link is not None
    return [
        out[0],
        out[1],
        out[2] if has_link else None,
        out[3] if has_link else None,
        out[4],
        out[5],
        out[6],
    ]


@torch.compiler.disable
def sequence(
    x: Tensor,
    lengths: Tensor | None,
    controller_state: list[Tensor],
    memory_state: Sequence[Tensor | None],
    weights: list[Tensor],
    offsets: list[int],
    *,
    lstm: bool,
    layers: int,
    forget_bias: float,
    clip: float,
    deepmind: bool,
    usage_write_grad: bool,
    dealloc_content: bool,
    interface_clip: float,
    eps: float,
) -> tuple[Tensor, Tensor, list[Tensor], list[Tensor | None]]:
    """The controller, the interface and the memory over ``x`` as ``relmem_dnc::sequence``.

    Args:
        x: ``[T, B, X]``, float32 or float64 on the CPU.
        lengths: ``[B]`` int64 (a finished example keeps its state), or None.
        controller_state: per layer ``h [B, H]`` (and ``c`` for an LSTM).
        memory_state: ``(memory, usage, link or None, precedence or None, read_weights,
            write_weights, read_vectors)``.
        weights: per layer ``weight_ih, weight_hh, bias_ih, bias_hh``; then the interface's
            ``weight [I, L·H]`` and ``bias [I]``.
        offsets: where each of :data:`OPERATOR_FIELDS` starts in ξ.
        lstm, layers, forget_bias, clip: the controller. deepmind, usage_write_grad,
            dealloc_content, interface_clip, eps: the memory's options.

    Returns:
        ``(hiddens [T, B, L·H], reads [T, B, R·W], final controller state as given, final
        memory state as given)``.
    """
    empty = x.new_empty(0)
    memory = [empty if t is None else t for t in memory_state]
    out = torch.ops.relmem_dnc.sequence(
        x,
        lengths,
        controller_state,
        memory,
        weights,
        offsets,
        lstm,
        layers,
        forget_bias,
        clip,
        deepmind,
        usage_write_grad,
        dealloc_content,
        interface_clip,
        eps,
    )
    count = len(controller_state)
    final_memory: list[Tensor | None] = list(out[2 + count :])
    if memory_state[2] is None:
        final_memory[2] = final_memory[3] = None
    return out[0], out[1], list(out[2 : 2 + count]), final_memory
