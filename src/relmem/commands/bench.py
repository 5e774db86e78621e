"""``relmem bench``: RMC (or, with ``--core dnc``, DNC) throughput, written to JSON.

With ``--core dnc`` it times the DNC's configurations
(:data:`relmem.benchmarking.dnc.DNC_CONFIGS`: ``repeat-copy``, ``copy``, ``reader-cpu``,
``reader-paper``): the reference memory step, the fused one, an ``nn.LSTM`` of equal parameters,
the step's bare products (``matmul-floor``) and ixaxaar's ``pytorch-dnc`` when the ``dnc`` package
is installed (:mod:`relmem.benchmarking.dnc`). Otherwise, for each RMC configuration
(:data:`relmem.benchmarking.configs.CONFIGS`) it times, on one device
and in one process:

- ``reference``: :class:`RelationalMemory` with ``implementation='reference'`` (the plain
  time loop, the test oracle);
- ``fast``: ``implementation='fast'`` (eager; ``docs/rmc.md`` §10 equivalences);
- on the CPU ``fused``: ``implementation='fused'`` (the fast path in C++: the sequence as one
  operator with its own backward, :mod:`relmem.cores.rmc.fused`; compiled on first use);
- on CUDA also ``fast+graph`` (the whole sequence, forward and backward, in CUDA graphs),
  ``fast+graph+bf16`` (bf16 matmuls; LN, softmax and state in fp32) and with ``--compile``
  ``fast+compile`` (``torch.compile`` of the step; CPU too);
- ``lstm-params``: ``nn.LSTM`` whose hidden size gives about the RMC's parameter count;
- ``lstm-width``: ``nn.LSTM`` with hidden size N·M, the RMC's output width;
- with ``--against-port PATH``, ``port``: the public PyTorch port's ``RelationalMemory``
  (L0SG/relational-rnn-pytorch, ``relational_rnn_general.py``) from the user's copy of that
  file, on every configuration whose options it has (:mod:`relmem.benchmarking.port`);
- ``matmul-floor``: the fast path's weight matmuls alone, forward and backward, with nothing
  else (:func:`relmem.benchmarking.baselines.matmul_floor_passes`): an estimate of the least
  time an exact implementation built on the same GEMM can take, so ``reference ÷ matmul-floor``
  estimates the most a fast path can gain on the device.

Each implementation is timed for the forward pass (under ``torch.no_grad``) and for forward +
backward of ``output.sum() + final_state.sum()``: ``--warmup`` untimed runs, then ``--repeat``
timed runs taken round-robin over the implementations (so a busy spell of a shared machine hits
all of them), median reported (and min/max). Throughput is time steps × batch per second. Peak
memory is the CUDA allocator's peak on CUDA; on the CPU it is the bytes autograd saves for the
backward pass (the activation memory), counted with ``saved_tensors_hooks``. On the CPU the
process keeps the memory a pass frees for the next (:func:`relmem.benchmarking.timing.
keep_freed_memory`), so one implementation's frees do not cost the next one page faults.

Results go to ``benchmarks/results/bench-<device>-<UTC time>.json`` with machine information
(CPU or GPU name, core count, load average, torch/CUDA versions, git SHA);
``benchmarks/plot_bench.py`` draws them.

Example::

    relmem bench --device cpu --configs small wikitext2_port --repeat 5
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import torch
import tyro

from relmem.benchmarking.configs import CONFIGS, IMPLEMENTATIONS
from relmem.benchmarking.dnc import (
    DNC_CONFIGS,
    DNC_IMPLEMENTATIONS,
    pytorch_dnc_available,
    run_dnc_config,
)
from relmem.benchmarking.port import file_sha256, load_port_class
from relmem.benchmarking.report import prepare_out_dir, progress_header, summary, write_results
from relmem.benchmarking.runner import run_config
from relmem.benchmarking.timing import keep_freed_memory
from relmem.env_info import machine_info
from relmem.validation import check_at_least

ConfigName = Literal[(*CONFIGS, *DNC_CONFIGS)]  # type: ignore[valid-type]
ImplementationName = Literal[  # type: ignore[valid-type]
    tuple(dict.fromkeys((*IMPLEMENTATIONS, *DNC_IMPLEMENTATIONS)))
]
CORES = {"rmc": (CONFIGS, IMPLEMENTATIONS), "dnc": (DNC_CONFIGS, DNC_IMPLEMENTATIONS)}


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass
class BenchArgs:
    """Time the RMC (reference, fast) or the DNC (reference, fused) against nn.LSTM; write JSON
    results."""

    device: str = field(default_factory=_default_device)
    """Device to time on: cpu, cuda or cuda:N."""
    core: Literal["rmc", "dnc"] = "rmc"
    """The core to time: the RMC or the DNC (its memory step)."""
    configs: tuple[ConfigName, ...] | None = None
    """Configurations to time (default: all of the core's; see --list)."""
    only: tuple[ImplementationName, ...] | None = None
    """Implementations to time (default: all available)."""
    steps: int | None = None
    """Override T for every configuration."""
    batch: int | None = None
    """Override B for every configuration."""
    warmup: int = 1
    """Untimed runs first."""
    repeat: int = 5
    """Timed runs."""
    compile: bool = False
    """Also time fast+compile."""
    threads: int | None = None
    """torch.set_num_threads (CPU)."""
    against_port: Path | None = None
    """Also time the public port's RelationalMemory, from your copy of L0SG/relational-rnn-pytorch's
    relational_rnn_general.py."""
    out: Path = Path("benchmarks/results")
    """Directory for the JSON file."""
    list_configs: Annotated[bool, tyro.conf.arg(name="list")] = False
    """List the configurations and exit."""

    def __post_init__(self) -> None:
        check_at_least("--", self, warmup=0, repeat=1, steps=1, batch=1, threads=1)


def _device(name: str) -> torch.device:
    """The device ``--device`` names, if the bench can time on it here.

    Args:
        name: ``cpu``, ``cuda`` or ``cuda:N`` (the timer synchronises no other device type).

    Raises:
        ValueError: ``name`` is none of those, or names a CUDA device this machine lacks.
    """
    try:
        device = torch.device(name)
    except RuntimeError:  # not a device string torch knows
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu, cuda or cuda:N, got {name!r}")
    count = torch.cuda.device_count()
    if device.type == "cuda" and (device.index or 0) >= count:
        raise ValueError(
            f"--device {name}: this machine has {count} CUDA device(s); use --device cpu"
            + (f" or cuda:0..cuda:{count - 1}" if count else "")
        )
    return device


def _check_core(args: BenchArgs) -> tuple[str, ...]:
    """The configurations to time: ``--configs`` or all of the core's.

    Raises:
        ValueError: a configuration or an ``--only`` implementation of the other core.
    """
    configs, impls = CORES[args.core]
    for name in args.configs or ():
        if name not in configs:
            raise ValueError(
                f"--configs {name} is not one of the {args.core.upper()}'s configurations "
                f"(--core {args.core}): {', '.join(configs)}"
            )
    for name in args.only or ():
        if name not in impls:
            raise ValueError(
                f"--only {name} is not timed with --core {args.core}; its implementations: "
                f"{', '.join(impls)}"
            )
    return tuple(args.configs or configs)


def _check_only(args: BenchArgs, device: torch.device) -> None:
    """Refuse an ``--only`` implementation this run cannot time (it was left out silently,
    down to an empty result file).

    Raises:
        ValueError: naming the implementation and what it needs.
    """
    needs = {
        "port": ("--against-port PATH", args.against_port is not None),
        "fast+compile": ("--compile", args.compile),
        "fast+graph": ("--device cuda", device.type == "cuda"),
        "fast+graph+bf16": ("--device cuda", device.type == "cuda"),
        "fused": ("--device cpu", device.type == "cpu"),
        "pytorch-dnc": ("the dnc package (pip install 'relmem[bench]')", pytorch_dnc_available()),
    }
    for name in args.only or ():
        need, present = needs.get(name, ("", True))
        if not present:
            raise ValueError(f"--only {name} needs {need}")


def parse(argv: list[str]) -> BenchArgs:
    """``relmem bench``'s options.

    Raises:
        SystemExit: from tyro: status 0 after --help; status 2, with a message on stderr, for
            a malformed option or a value out of range.
    """
    return tyro.cli(BenchArgs, args=argv, prog="relmem bench", description=BenchArgs.__doc__)


def _error(message: str) -> int:
    """Print ``message`` as the one line of a failed ``relmem bench``; exit status 2."""
    print(f"relmem bench: error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str]) -> int:
    """Entry point of ``relmem bench``; returns the exit status."""
    args = parse(argv)
    if args.list_configs:
        if args.core == "dnc":
            for name, dnc_config in DNC_CONFIGS.items():
                print(f"{name:<15} T×B={dnc_config.shape}  {dnc_config.note}")
            return 0
        for name, config in CONFIGS.items():
            print(f"{name:<15} T×B={config.shape} (CPU {config.cpu_shape})  {config.note}")
        return 0
    try:  # every option checked before the first timing
        device = _device(args.device)
        configs = _check_core(args)
        _check_only(args, device)
        if args.core == "dnc" and args.against_port is not None:
            raise ValueError("--against-port times the RMC's port; with --core dnc leave it out")
        port = None if args.against_port is None else load_port_class(args.against_port)
        prepare_out_dir(args.out)
    except ValueError as exc:  # a PortError too; each message names its option
        return _error(str(exc))
    if args.threads:
        torch.set_num_threads(args.threads)
    info = machine_info(device)
    if device.type == "cpu":
        info["freed_memory"] = keep_freed_memory()
    print(
        f"# {info.get('gpu', info['cpu'])} | torch {info['torch']} | "
        f"threads {info['torch_threads']} | load {info['load_average']}"
    )
    print(progress_header())
    records = []
    common = {
        "steps": args.steps,
        "batch": args.batch,
        "only": args.only,
        "warmup": args.warmup,
        "repeat": args.repeat,
    }
    for name in configs:
        if args.core == "dnc":
            records += run_dnc_config(name, device, **common)
        else:
            records += run_config(name, device, compile_step=args.compile, port=port, **common)
    table = summary(records)
    print("\n" + table)
    payload = {
        "machine": info,
        "argv": argv,
        "warmup": args.warmup,
        "repeat": args.repeat,
        "results": records,
        "port": None
        if args.against_port is None
        else {"path": str(args.against_port), "sha256": file_sha256(args.against_port)},
        "table": table,
    }
    path = write_results(args.out, device.type, payload)
    print(f"\nwrote {path}")
    return 0
