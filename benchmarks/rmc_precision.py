"""How far the RMC's reference and fast paths land from a float64 run, in float32 and bf16.

``tests/cores/test_rmc_fast.py::test_cuda_paths_match_reference`` compares the fast path in
bf16 (``FastRelationalMemory(matmul_dtype=torch.bfloat16)``: autocast matmuls) with the float32
reference under one relative bound. Whether a miss is a fault of the fast path or the case's
own conditioning in bf16 needs a third party: this script runs each option case once in float64
on the CPU (the truth) and then, on ``--device``,

- ``ref-f32``: the reference in float32;
- ``fast-f32``: ``FastRelationalMemory`` in float32 (the eager fast path, no graph), and on
  the CPU ``fused-f32``, the fused C++ path;
- ``ref-bf16``: the reference under the same autocast as the fast path's bf16 mode;
- ``fast-bf16``: ``FastRelationalMemory`` with ``matmul_dtype=torch.bfloat16``,

with the same inputs, initial state and upstream gradients (drawn as the test draws them), and
prints each run's relative error (``‖got − truth‖ / ‖truth‖``) in the output, the final memory,
the input's and the initial memory's gradients, and the worst parameter gradient. On CUDA,
``--sdpa`` repeats the runs with each scaled-dot-product-attention backend forced.

    PYTHONPATH=src python benchmarks/rmc_precision.py
    PYTHONPATH=src python benchmarks/rmc_precision.py --seeds $(seq 0 15)
    PYTHONPATH=src python benchmarks/rmc_precision.py --device cuda --sdpa --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from relmem.benchmarking.precision import Autocast, Problem, relative_errors, run_with_gradients
from relmem.cores.rmc import FastRelationalMemory, RelationalMemory, RMCState
from relmem.env_info import machine_info

# The option cases of the CUDA test (the keyword arguments tests/cores/test_rmc_fast.py uses).
BASE = {"input_size": 5, "mem_slots": 3, "head_size": 4, "num_heads": 2}
CASES: dict[str, dict[str, Any]] = {
    "default": {},
    "blocks-3": {"num_blocks": 3},
    "output-gate": {"output_gate": True, "output_bias": 0.5},
    "one-slot-e7": {"mem_slots": 1, "num_heads": 3, "key_size": 2},
    "matrix-input": {"input_rows": 3},
    "query-memory-b2": {"query_rows": "memory", "num_blocks": 2},
}


def build(case: str, randomise: bool) -> RelationalMemory:
    """The test's reference core: seed 0, every parameter perturbed unless ``randomise`` is
    off (the test's bf16 modes keep the initialisation)."""
    torch.manual_seed(0)
    core = RelationalMemory(**{**BASE, **CASES[case]}, implementation="reference")
    if randomise:
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in core.parameters():
                p.add_(0.3 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return core


def problem(core: RelationalMemory, seed: int, steps: int, batch: int) -> Problem:
    """Inputs ``[T, B, (n,) F]``, an initial state and upstream gradients for the outputs and
    the final state, all float32 on the CPU."""
    torch.manual_seed(seed)
    cfg = core.config
    rows = () if cfg.input_rows is None else (cfg.input_rows,)
    inputs = torch.randn(steps, batch, *rows, cfg.input_size)
    state = core.initial_state(batch)
    memory = state.memory + 0.5 * torch.randn_like(state.memory)
    hidden = None if state.hidden is None else torch.tanh(torch.randn_like(state.hidden))
    with torch.no_grad():
        output = core(inputs, RMCState(memory, hidden))[0]
    out_grad = torch.randn_like(output)  # before the state's: the draws' order is the data
    state_grad = tuple(None if s is None else torch.randn_like(s) for s in (memory, hidden))
    return Problem(inputs, RMCState(memory, hidden), out_grad, state_grad)


def errors(
    got: tuple[dict[str, Tensor], dict[str, Tensor]],
    truth: tuple[dict[str, Tensor], dict[str, Tensor]],
) -> dict[str, Any]:
    """Relative errors of the named quantities and of the worst parameter gradient."""
    quantities = relative_errors(got[0], truth[0])
    params = relative_errors(got[1], truth[1])
    worst = max(params, key=params.__getitem__)
    named = {
        k: quantities[k] for k in ("output", "final memory", "input grad", "initial memory grad")
    }
    return {**named, "worst param": worst, "worst param grad": params[worst]}


def backends(device: str, sdpa: bool) -> Iterator[tuple[str, Callable[[], Any]]]:
    """(name, context factory) for the attention backends to try."""
    yield "default", contextlib.nullcontext
    if device == "cuda" and sdpa:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        for backend in ("MATH", "EFFICIENT_ATTENTION", "FLASH_ATTENTION", "CUDNN_ATTENTION"):
            chosen = getattr(SDPBackend, backend)
            yield backend.lower(), lambda chosen=chosen: sdpa_kernel([chosen])


def measure(case_name: str, seed: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    records = []
    for precision in ("f32", "bf16"):
        base = build(case_name, randomise=precision == "f32")
        case = problem(base, seed, args.steps, args.batch)
        truth = run_with_gradients(copy.deepcopy(base).double(), case, "cpu", torch.float64)
        core = copy.deepcopy(base).to(args.device)
        runs: dict[str, nn.Module] = {}
        if precision == "f32":
            runs["ref-f32"] = core
            runs["fast-f32"] = FastRelationalMemory(copy.deepcopy(core))
            if args.device == "cpu" and not args.no_fused:
                fused = copy.deepcopy(core)
                fused.implementation = fused.cell.implementation = "fused"
                runs["fused-f32"] = fused
        else:
            runs["ref-bf16"] = Autocast(copy.deepcopy(core))
            runs["fast-bf16"] = FastRelationalMemory(
                copy.deepcopy(core), matmul_dtype=torch.bfloat16
            )
        for backend, context in backends(args.device, args.sdpa):
            for run, module in runs.items():
                record = {"case": case_name, "seed": seed, "run": run, "sdpa": backend}
                try:
                    with context():
                        got = run_with_gradients(module, case, args.device, torch.float32)
                except RuntimeError as error:  # a forced backend that does not take the shapes
                    record["error"] = str(error).splitlines()[0][:120]
                else:
                    record |= errors(got, truth)
                records.append(record)
    return records


def summary(records: list[dict[str, Any]], bound: float) -> None:
    """Per case and run, over the seeds: the median and the largest of each run's worst
    gradient error (input, initial memory or parameter), and how many seeds exceed ``bound``."""
    groups: dict[tuple[str, str, str], list[float]] = {}
    for r in records:
        if "error" not in r:
            worst = max(r["input grad"], r["initial memory grad"], r["worst param grad"])
            groups.setdefault((r["case"], r["run"], r["sdpa"]), []).append(worst)
    print(f"\n| case | run | sdpa | seeds | worst gradient error: median | largest | > {bound} |")
    print("|---|---|---|---:|---:|---:|---:|")
    for (case, run, sdpa), worst in groups.items():
        over = sum(w > bound for w in worst)
        print(
            f"| {case} | {run} | {sdpa} | {len(worst)} | {statistics.median(worst):.1e} | "
            f"{max(worst):.1e} | {over} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--sdpa", action="store_true", help="on CUDA, force each SDPA backend")
    parser.add_argument(
        "--no-fused", action="store_true", help="on the CPU, leave out fused-f32 (a C++ build)"
    )
    parser.add_argument(
        "--bound", type=float, default=6e-2, help="the summary counts seeds above this error"
    )
    parser.add_argument("--json", help="also write the records and the machine to this file")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available on this machine; use --device cpu")
    if args.sdpa and args.device != "cuda":
        parser.error("--sdpa forces CUDA's attention backends; it needs --device cuda")
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # as the test: float32 means IEEE float32
    print(
        "| case | seed | run | sdpa | output | final memory | input grad | initial memory "
        "grad | worst parameter grad |"
    )
    print("|---|---:|---|---|---:|---:|---:|---:|---|")
    records = []
    for case_name in args.cases:
        for seed in args.seeds:
            for r in measure(case_name, seed, args):
                records.append(r)
                cells = [r["case"], str(seed), r["run"], r["sdpa"]]
                if "error" in r:
                    cells += ["", "", "", "", r["error"]]
                else:
                    cells += [
                        f"{r[k]:.1e}"
                        for k in ("output", "final memory", "input grad", "initial memory grad")
                    ]
                    cells.append(f"{r['worst param grad']:.1e} ({r['worst param']})")
                print("| " + " | ".join(cells) + " |", flush=True)
    summary(records, args.bound)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "machine": machine_info(torch.device(args.device)),
                    "args": vars(args),
                    "records": records,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
