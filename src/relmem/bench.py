"""``relmem bench``: RMC throughput, reference vs fast vs ``nn.LSTM``, written to JSON.

For each configuration it times, on one device and in one process:

- ``reference``: :class:`RelationalMemory` with ``implementation='reference'`` (the plain
  time loop, the test oracle);
- ``fast``: ``implementation='fast'`` (eager; spec section 10 equivalences);
- on CUDA also ``fast+graph`` (the whole sequence, forward and backward, in CUDA graphs),
  ``fast+graph+bf16`` (bf16 matmuls; LN, softmax and state in fp32) and with ``--compile``
  ``fast+compile`` (``torch.compile`` of the step; CPU too);
- ``lstm-params``: ``nn.LSTM`` whose hidden size gives about the RMC's parameter count;
- ``lstm-width``: ``nn.LSTM`` with hidden size N·M, the RMC's output width;
- ``matmul-floor``: the fast path's weight matmuls alone, forward and backward, with nothing
  else (:func:`matmul_floor_passes`): an estimate of the least time an exact implementation
  built on the same GEMM can take, so ``reference ÷ matmul-floor`` estimates the most a fast
  path can gain on the device.

Each implementation is timed for the forward pass (under ``torch.no_grad``) and for forward +
backward of ``output.sum() + final_state.sum()``: ``--warmup`` untimed runs, then ``--repeat``
timed runs taken round-robin over the implementations (so a busy spell of a shared machine hits
all of them), median reported (and min/max). Throughput is time steps × batch per second. Peak
memory is the CUDA allocator's peak on CUDA; on the CPU it is the bytes autograd saves for the
backward pass (the activation memory), counted with ``saved_tensors_hooks``.

Results go to ``benchmarks/results/bench-<device>-<UTC time>.json`` with machine information
(CPU or GPU name, core count, load average, torch/CUDA versions, git SHA);
``benchmarks/plot_bench.py`` draws them.

Example::

    relmem bench --device cpu --configs small wikitext2_port --repeat 5
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from relmem.cores.rmc import (
    FastRelationalMemory,
    RelationalMemory,
    RMCConfig,
    fast_path_plan,
    fast_path_products,
    step_flops,
)
from relmem.cores.rmc.fast import Product

FLOOR = "matmul-floor"
IMPLEMENTATIONS = ["reference", "fast", "fast+compile", "fast+graph", "fast+graph+bf16",
                   "lstm-params", "lstm-width", FLOOR]


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark configuration: an RMC and the sequence shapes to run it at.

    Attributes:
        rmc: :class:`RelationalMemory` keyword arguments.
        shape: ``(T, B)`` on CUDA (the task's own shape).
        cpu_shape: ``(T, B)`` on the CPU (reduced where the task's shape takes minutes).
        note: where the configuration comes from.
    """

    rmc: dict[str, Any]
    shape: tuple[int, int]
    cpu_shape: tuple[int, int]
    note: str = ""


CONFIGS: dict[str, BenchConfig] = {
    "small": BenchConfig(
        {"input_size": 32, "mem_slots": 4, "head_size": 32, "num_heads": 4},
        (50, 32),
        (50, 32),
        "issue's small core: 4 slots, 4 heads of 32, batch 32 x 50 steps, input 32",
    ),
    "wikitext2_port": BenchConfig(
        {"input_size": 192, "mem_slots": 1, "head_size": 192, "num_heads": 4, "key_size": 64,
         "attention_mlp_layers": 3},
        (100, 64),
        (100, 64),
        "L0SG/relational-rnn-pytorch WikiText-2 core (targets.md 3.2): batch 64 x BPTT 100",
    ),
    "nth_farthest": BenchConfig(
        {"input_size": 40, "mem_slots": 8, "head_size": 32, "num_heads": 8},
        (8, 1600),
        (8, 64),
        "paper Nth Farthest preset (tasks.md 1): 8 vectors, batch 1600",
    ),
    "lte": BenchConfig(
        {"input_size": 45, "mem_slots": 4, "head_size": 128, "num_heads": 4,
         "gate_style": "memory"},
        (67, 128),
        (67, 8),
        "paper Learning-to-Execute preset (tasks.md 2): 57 + 10 steps, batch 128",
    ),
    "lm_paper": BenchConfig(
        {"input_size": 512, "mem_slots": 1, "head_size": 625, "num_heads": 4,
         "attention_mlp_layers": 5},
        (100, 64),
        (10, 8),
        "paper language-model core (tasks.md 3.4): M=2500, 76 M parameters, BPTT 100",
    ),
}


def matmul_floor_passes(
    config: RMCConfig, steps: int, batch: int, device: torch.device
) -> dict[str, Callable[[], None]]:
    """The fast path's weight matmuls alone, as timed passes: an estimate of the least time an
    exact implementation built on the same GEMM can take.

    ``forward`` runs every loop product once per step and every hoisted product once over
    T·B·rows; ``train`` adds the backward products: per step the input gradient ``dY·W``, and
    per weight one ``dYᵀ·X`` over all T·B rows (E10's arrangement, the fewest GEMM calls).
    No autograd, no LayerNorm, softmax, gates or copies.
    """
    products = fast_path_products(config)
    generator = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=generator).to(device)

    def tensors(product: Product, rows: int) -> tuple[Tensor, Tensor, Tensor]:
        x = rand(rows * product.rows, product.inputs)
        return x, rand(product.outputs, product.inputs), rand(rows * product.rows, product.outputs)

    loop = [tensors(p, batch) for p in products["loop"]]
    loop_all = [(rand(steps * batch * p.rows, p.inputs), rand(steps * batch * p.rows, p.outputs))
                for p in products["loop"]]
    hoisted = [tensors(p, steps * batch) for p in products["hoisted"]]

    def forward() -> None:
        for x, w, _ in hoisted:
            torch.mm(x, w.t())
        for _ in range(steps):
            for x, w, _ in loop:
                torch.mm(x, w.t())

    def train() -> None:
        forward()
        for _ in range(steps):
            for _, w, g in loop:
                torch.mm(g, w)  # dX
        for x_all, g_all in loop_all:
            torch.mm(g_all.t(), x_all)  # dW over all T·B rows
        for x, w, g in hoisted:
            torch.mm(g, w)
            torch.mm(g.t(), x)

    return {"forward": forward, "train": train}


def lstm_step_flops(input_size: int, hidden: int) -> dict[str, int]:
    """``nn.LSTM`` matmul FLOPs per example per step: recurrent (in the loop) and input."""
    return {"loop": 2 * hidden * 4 * hidden, "hoisted": 2 * input_size * 4 * hidden}


def lstm_hidden_for_params(input_size: int, params: int) -> int:
    """The ``nn.LSTM`` hidden size h whose 4h(F + h) + 8h parameters come closest to ``params``."""
    a, b = 4.0, 4.0 * input_size + 8.0
    return max(1, round((-b + math.sqrt(b * b + 4 * a * params)) / (2 * a)))


def machine_info(device: torch.device) -> dict[str, Any]:
    """Device, software and load information recorded with every result file."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    try:
        with open("/proc/cpuinfo") as handle:
            names = [line.split(":", 1)[1].strip() for line in handle if "model name" in line]
        info["cpu"] = names[0] if names else platform.processor()
    except OSError:
        info["cpu"] = platform.processor()
    try:
        info["git_sha"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        info["git_sha"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            gpu=props.name,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            multiprocessors=props.multi_processor_count,
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
        )
        try:
            info["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, check=True,
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            info["driver"] = None
    return info


class _LSTMCore(nn.Module):
    """``nn.LSTM`` with the RMC's call convention: ``[T, B, F] -> ([T, B, h], (h_T, c_T))``."""

    def __init__(self, input_size: int, hidden: int, **factory: Any) -> None:
        super().__init__()
        self.lstm = nn.LSTM(input_size, hidden, **factory)

    def forward(self, x: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        output, (h, c) = self.lstm(x)
        return output, (h, c)


def _final_tensors(final: Any) -> list[Tensor]:
    return [t for t in final if isinstance(t, Tensor)]


def _passes(module: nn.Module, inputs: Tensor) -> dict[str, Callable[[], None]]:
    """The two timed passes: forward under ``no_grad``, and forward + backward."""

    def forward() -> None:
        with torch.no_grad():
            module(inputs)

    def train() -> None:
        output, final = module(inputs)
        loss = output.sum() + sum(t.sum() for t in _final_tensors(final))
        loss.backward()

    return {"forward": forward, "train": train}


def _drop_grads(module: nn.Module | None) -> None:
    if module is not None:
        module.zero_grad(set_to_none=True)


def _saved_bytes(run: Callable[[], Any]) -> int:
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


def _implementations(
    name: str, config: BenchConfig, device: torch.device, compile_step: bool
) -> dict[str, nn.Module]:
    torch.manual_seed(0)
    reference = RelationalMemory(**config.rmc, implementation="reference", device=device)
    fast = RelationalMemory(**config.rmc, implementation="fast", device=device)
    fast.load_state_dict(reference.state_dict())
    impls: dict[str, nn.Module] = {"reference": reference, "fast": fast}
    if compile_step:
        impls["fast+compile"] = FastRelationalMemory(fast, compile=True)
    if device.type == "cuda":
        impls["fast+graph"] = FastRelationalMemory(fast, cuda_graph=True)
        impls["fast+graph+bf16"] = FastRelationalMemory(
            fast, cuda_graph=True, matmul_dtype=torch.bfloat16
        )
    params = sum(p.numel() for p in reference.parameters())
    f = config.rmc["input_size"]
    impls["lstm-params"] = _LSTMCore(f, lstm_hidden_for_params(f, params), device=device)
    impls["lstm-width"] = _LSTMCore(f, reference.output_size, device=device)
    return impls


def run_config(
    name: str, device: torch.device, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Time every implementation of one configuration; one record per implementation."""
    config = CONFIGS[name]
    steps, batch = config.shape if device.type == "cuda" else config.cpu_shape
    if args.steps:
        steps = args.steps
    if args.batch:
        batch = args.batch
    impls = _implementations(name, config, device, args.compile)
    torch.manual_seed(1)
    inputs = torch.randn(steps, batch, config.rmc["input_size"], device=device)
    rmc_config = impls["reference"].config
    rmc_params = sum(p.numel() for p in impls["reference"].parameters())
    selected = {k: v for k, v in impls.items() if not args.only or k in args.only}
    passes = {impl: _passes(module, inputs) for impl, module in selected.items()}
    if not args.only or FLOOR in args.only:
        passes[FLOOR] = matmul_floor_passes(rmc_config, steps, batch, device)
    timings = bench_interleaved(
        passes, steps, batch, device, args.warmup, args.repeat,
        reset=lambda name: _drop_grads(selected.get(name)),
    )
    if device.type == "cpu":
        for impl, module in selected.items():
            timings[impl]["train"]["saved_activation_bytes"] = _saved_bytes(
                lambda module=module: module(inputs)
            )
    records = []
    for impl in passes:
        module = selected.get(impl)
        record = {
            "config": name,
            "implementation": impl,
            "device": str(device),
            "dtype": "float32",
            "steps": steps,
            "batch": batch,
            "rmc": config.rmc,
            "note": config.note,
            "parameters": rmc_params if module is None else sum(
                p.numel() for p in module.parameters()
            ),
            "rmc_parameters": rmc_params,
            **timings[impl],
        }
        if impl.startswith("lstm"):
            hidden = module.lstm.hidden_size
            record["lstm_hidden"] = hidden
            record["step_flops"] = lstm_step_flops(config.rmc["input_size"], hidden)
        else:
            record["step_flops"] = step_flops(rmc_config)
            if impl != "reference":
                record["equivalences"] = fast_path_plan(rmc_config)
            if impl == FLOOR:
                record["products"] = {
                    k: [p._asdict() for p in v] for k, v in fast_path_products(rmc_config).items()
                }
        records.append(record)
        print(_row(record), flush=True)
    return records


def _row(record: dict[str, Any]) -> str:
    return (
        f"{record['config']:<15} {record['implementation']:<16} "
        f"{record['forward']['median_ms']:>10.2f} {record['train']['median_ms']:>12.2f} "
        f"{record['train']['items_per_s']:>12.0f}"
    )


def summary(records: list[dict[str, Any]]) -> str:
    """A Markdown table: per configuration and implementation, ms and ratios."""
    lines = [
        "| config | T×B | implementation | fwd ms | fwd+bwd ms | fwd+bwd steps·batch/s "
        "| ÷ lstm-params | ÷ lstm-width | ÷ matmul-floor | reference ÷ this |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    by_config: dict[str, dict[str, dict[str, Any]]] = {}
    for record in records:
        by_config.setdefault(record["config"], {})[record["implementation"]] = record
    for config, impls in by_config.items():
        train_ms = {impl: r["train"]["median_ms"] for impl, r in impls.items()}
        for impl, record in impls.items():
            ms = train_ms[impl]
            cells = []
            for other in ("lstm-params", "lstm-width", FLOOR):
                cells.append(f"{ms / train_ms[other]:.2f}×" if other in train_ms else "–")
            ref = train_ms.get("reference")
            cells.append(f"{ref / ms:.2f}×" if ref else "–")
            lines.append(
                f"| {config} | {record['steps']}×{record['batch']} | {impl} "
                f"| {record['forward']['median_ms']:.1f} | {ms:.1f} "
                f"| {record['train']['items_per_s']:.0f} | " + " | ".join(cells) + " |"
            )
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="relmem bench",
        description="Time the RMC (reference, fast) against nn.LSTM; write JSON results.",
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--only", nargs="+", choices=IMPLEMENTATIONS,
                        help="implementations to time (default: all available)")
    parser.add_argument("--steps", type=int, help="override T for every configuration")
    parser.add_argument("--batch", type=int, help="override B for every configuration")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first (default 1)")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs (default 5)")
    parser.add_argument("--compile", action="store_true", help="also time fast+compile")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (CPU)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"),
                        help="directory for the JSON file (default benchmarks/results)")
    parser.add_argument("--list", action="store_true", help="list configurations and exit")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    """Entry point of ``relmem bench``."""
    args = parse_args(argv)
    if args.list:
        for name, config in CONFIGS.items():
            print(f"{name:<15} T×B={config.shape} (CPU {config.cpu_shape})  {config.note}")
        return 0
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("relmem bench: CUDA is not available; use --device cpu")
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    info = machine_info(device)
    print(f"# {info.get('gpu', info['cpu'])} | torch {info['torch']} | "
          f"threads {info['torch_threads']} | load {info['load_average']}")
    header = ("config", "implementation", "fwd ms", "fwd+bwd ms", "items/s")
    print(f"{header[0]:<15} {header[1]:<16} {header[2]:>10} {header[3]:>12} {header[4]:>12}")
    records = []
    for name in args.configs:
        records += run_config(name, device, args)
    table = summary(records)
    print("\n" + table)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"bench-{device.type}-{stamp}.json"
    payload = {
        "machine": info,
        "argv": argv,
        "warmup": args.warmup,
        "repeat": args.repeat,
        "finished_utc": stamp,
        "load_average_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "results": records,
        "table": table,
    }
    path.write_text(json.dumps(payload, indent=1))
    print(f"\nwrote {path}")
    return 0
