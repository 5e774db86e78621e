"""The timing harness: forward and forward + backward passes timed round-robin, saved bytes."""

from __future__ import annotations

import ctypes
import ctypes.util
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn


def _final_tensors(final: Any) -> list[Tensor]:
    """The floating tensors of a final state, nested tuples included (an ``RMCState`` may hold
    a None, a ``DNCState`` its controller's ``(h, c)`` pairs)."""
    if isinstance(final, Tensor):
        return [final] if final.is_floating_point() else []
    if isinstance(final, (tuple, list)):
        return [t for part in final for t in _final_tensors(part)]
    return []


# glibc's mallopt parameters and the largest mmap threshold it takes on a 64-bit machine
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX = -1, -3, 32 * 1024 * 1024


def keep_freed_memory() -> str:
    """Ask glibc's malloc to keep the memory a pass frees for the next pass (no trimming of the
    heap, blocks up to 32 MB from the heap instead of their own mappings), and say what was done.

    Implementations are timed round-robin in one process. With glibc's defaults, a pass that
    frees a lot (``pytorch-dnc``'s) hands the memory back to the system, and the next
    implementation's pass page-faults its buffers in again: at the DNC's ``copy`` sizes that
    made the fused path's pass 14 ms after one of ``pytorch-dnc``'s against 10 ms after its own
    (``docs/performance.md`` §7.7). A training process runs one model and keeps its memory (the
    ``copy`` preset's 3,000 steps took 30-33 s with these settings and without), so the bench
    times each implementation as it runs there.

    Returns:
        ``'kept'``, or why not (not glibc).
    """
    if not sys.platform.startswith("linux"):
        return f"default ({sys.platform}: not glibc)"
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "default (no glibc mallopt)"
    trimmed = mallopt(_M_TRIM_THRESHOLD, ctypes.c_int(2**31 - 1))
    mapped = mallopt(_M_MMAP_THRESHOLD, ctypes.c_int(_MMAP_THRESHOLD_MAX))
    return "kept" if trimmed and mapped else "default (mallopt refused)"


def timed_passes(module: nn.Module, inputs: Tensor) -> dict[str, Callable[[], None]]:
    """The two timed passes: forward under ``no_grad``, and forward + backward."""

    def forward() -> None:
        with torch.no_grad():
            module(inputs)

    def train() -> None:
        output, final = module(inputs)
        loss = output.sum() + sum(t.sum() for t in _final_tensors(final))
        loss.backward()

    return {"forward": forward, "train": train}


def drop_grads(module: nn.Module | None) -> None:
    """Set ``module``'s gradients to None (a no-op for None, the matmul floor's entry)."""
    if module is not None:
        module.zero_grad(set_to_none=True)


def saved_bytes(run: Callable[[], Any]) -> int:
    """Bytes autograd saves for backward during ``run()`` (each storage counted once)."""
    seen: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(seen.values())


def bench_interleaved(
    passes: dict[str, dict[str, Callable[[], None]]],
    steps: int,
    batch: int,
    device: torch.device,
    warmup: int,
    repeat: int,
    reset: Callable[[str], None] = lambda name: None,
) -> dict[str, dict[str, Any]]:
    """Forward (no grad) and forward+backward timings of several implementations.

    The implementations are timed round-robin (repeat r runs every one once before repeat
    r + 1), so a slow spell of a shared machine hits every implementation alike.

    Args:
        passes: per implementation, its ``forward`` and ``train`` callables.
        steps, batch: T and B, for the throughput.
        reset: called with an implementation's name before its warm-up (drops gradients).

    Returns:
        Per implementation and pass: median/min/max ms, every time, throughput
        (steps × batch / s) and, on CUDA, peak memory.
    """
    results: dict[str, dict[str, Any]] = {name: {} for name in passes}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *_: None)
    for kind in ("forward", "train"):
        peaks: dict[str, int] = {}
        for name, fns in passes.items():
            reset(name)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            for _ in range(warmup):
                fns[kind]()
            sync(device)
            if device.type == "cuda":
                peaks[name] = torch.cuda.max_memory_allocated(device)
        times: dict[str, list[float]] = {name: [] for name in passes}
        for _ in range(repeat):
            for name, fns in passes.items():
                start = time.perf_counter()
                fns[kind]()
                sync(device)
                times[name].append((time.perf_counter() - start) * 1e3)
        for name, values in times.items():
            median = statistics.median(values)
            results[name][kind] = {
                "median_ms": median,
                "min_ms": min(values),
                "max_ms": max(values),
                "items_per_s": steps * batch / (median / 1e3),
                "times_ms": values,
            }
            if name in peaks:
                results[name][kind]["peak_memory_bytes"] = peaks[name]
    return results


def builds(load: Callable[[], None]) -> bool:
    """Whether ``load()`` (a fused path's operator build) succeeds here; if not, say why on
    stderr: the bench then times everything else."""
    try:
        load()
    except RuntimeError as error:
        print(f"relmem bench: skipping 'fused': {error}", file=sys.stderr, flush=True)
        return False
    return True


def time_modules(
    modules: dict[str, nn.Module],
    inputs: Tensor,
    extra: dict[str, dict[str, Callable[[], None]]],
    device: torch.device,
    warmup: int,
    repeat: int,
) -> dict[str, dict[str, Any]]:
    """:func:`bench_interleaved` of each module's :func:`timed_passes` on ``inputs [T, B, F]``
    and of the ``extra`` passes (a matmul floor), each module's gradients dropped before its
    warm-up; on the CPU each module's :func:`saved_bytes` is added to its ``train`` timing.

    Returns:
        Per name, modules' first then ``extra``'s, the timings of :func:`bench_interleaved`.
    """
    passes = {name: timed_passes(module, inputs) for name, module in modules.items()}
    passes.update(extra)
    steps, batch = inputs.shape[0], inputs.shape[1]
    timings = bench_interleaved(
        passes, steps, batch, device, warmup, repeat, reset=lambda n: drop_grads(modules.get(n))
    )
    if device.type == "cpu":
        for name, module in modules.items():
            timings[name]["train"]["saved_activation_bytes"] = saved_bytes(
                lambda module=module: module(inputs)
            )
    return timings
