"""One benchmark configuration: build its implementations, time them, return one record each."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch
from torch import nn

from relmem.benchmarking.baselines import (
    floor_products,
    lstm_hidden_for_params,
    lstm_step_flops,
    matmul_floor_passes,
)
from relmem.benchmarking.configs import CONFIGS, FLOOR, PORT, BenchConfig
from relmem.benchmarking.port import PortCore, port_arguments
from relmem.benchmarking.report import progress_row
from relmem.benchmarking.timing import builds, time_modules
from relmem.cores.rmc import (
    FastRelationalMemory,
    RelationalMemory,
    fast_path_plan,
    step_flops,
)
from relmem.cores.rmc.fused import load_fused_ops


def _fused_available() -> bool:
    """Whether the RMC's fused operators build here (:func:`builds`)."""
    return builds(load_fused_ops)


def implementations(
    config: BenchConfig,
    device: torch.device,
    compile_step: bool,
    port: type[nn.Module] | None = None,
    only: Collection[str] | None = None,
) -> dict[str, nn.Module]:
    """The modules to time for ``config``: the RMC's implementations and the baselines.

    All RMC implementations share the reference's parameters; ``fused`` only on the CPU, where
    its operators build, and unless ``only`` (the implementations to time; None: all) leaves
    it out (loading its operators may compile them first); ``fast+compile`` only with
    ``compile_step``, the CUDA-graph ones only on CUDA, ``port`` (the public port's
    ``RelationalMemory`` class, :mod:`relmem.benchmarking.port`) where it has every option the
    configuration uses, with its own initialisation.
    """
    torch.manual_seed(0)
    reference = RelationalMemory(**config.rmc, implementation="reference", device=device)
    fast = RelationalMemory(**config.rmc, implementation="fast", device=device)
    fast.load_state_dict(reference.state_dict())
    impls: dict[str, nn.Module] = {"reference": reference, "fast": fast}
    if device.type == "cpu" and (not only or "fused" in only) and _fused_available():
        impls["fused"] = RelationalMemory(**config.rmc, implementation="fused", device=device)
        impls["fused"].load_state_dict(reference.state_dict())
    if compile_step:
        impls["fast+compile"] = FastRelationalMemory(fast, compile=True)
    if device.type == "cuda":
        impls["fast+graph"] = FastRelationalMemory(fast, cuda_graph=True)
        impls["fast+graph+bf16"] = FastRelationalMemory(
            fast, cuda_graph=True, matmul_dtype=torch.bfloat16
        )
    params = sum(p.numel() for p in reference.parameters())
    f = config.rmc["input_size"]
    impls["lstm-params"] = nn.LSTM(f, lstm_hidden_for_params(f, params), device=device)
    impls["lstm-width"] = nn.LSTM(f, reference.output_size, device=device)
    arguments = None if port is None else port_arguments(port, config.rmc)
    if port is not None and arguments is not None:
        torch.manual_seed(0)
        impls[PORT] = PortCore(port(**arguments)).to(device)
    return impls


def run_config(
    name: str,
    device: torch.device,
    *,
    steps: int | None = None,
    batch: int | None = None,
    only: Collection[str] | None = None,
    compile_step: bool = False,
    port: type[nn.Module] | None = None,
    warmup: int = 1,
    repeat: int = 5,
) -> list[dict[str, Any]]:
    """Time every implementation of one configuration; one record per implementation.

    Args:
        name: a key of :data:`CONFIGS`.
        device: where to run.
        steps, batch: override the configuration's T and B (its CPU shape on the CPU).
        only: the implementations to time (default: all available here).
        compile_step: also time ``fast+compile``.
        port: the public port's ``RelationalMemory`` class, timed as ``port`` (see
            :func:`implementations`).
        warmup, repeat: untimed and timed runs per implementation and pass.

    Returns:
        Records with the shape, parameter counts, timings (see :func:`time_modules`), the
        FLOP model and, for fast paths, the equivalences used. Each is also printed as a row.
    """
    config = CONFIGS[name]
    default_steps, default_batch = config.shape if device.type == "cuda" else config.cpu_shape
    steps, batch = steps or default_steps, batch or default_batch
    impls = implementations(config, device, compile_step, port, only)
    torch.manual_seed(1)
    inputs = torch.randn(steps, batch, config.rmc["input_size"], device=device)
    rmc_config = impls["reference"].config
    rmc_params = sum(p.numel() for p in impls["reference"].parameters())
    selected = {k: v for k, v in impls.items() if not only or k in only}
    floor = (
        {}
        if only and FLOOR not in only
        else {FLOOR: matmul_floor_passes(rmc_config, steps, batch, device)}
    )
    timings = time_modules(selected, inputs, floor, device, warmup, repeat)
    records = []
    for impl in timings:
        module = selected.get(impl)
        parameters = rmc_params if module is None else sum(p.numel() for p in module.parameters())
        record = {
            "config": name,
            "implementation": impl,
            "device": str(device),
            "dtype": "float32",
            "steps": steps,
            "batch": batch,
            "rmc": config.rmc,
            "note": config.note,
            "parameters": parameters,
            "rmc_parameters": rmc_params,
            **timings[impl],
        }
        if isinstance(module, nn.LSTM):
            hidden = module.hidden_size
            record["lstm_hidden"] = hidden
            record["step_flops"] = lstm_step_flops(config.rmc["input_size"], hidden)
        else:
            record["step_flops"] = step_flops(rmc_config)
            if impl not in ("reference", PORT):
                record["equivalences"] = fast_path_plan(rmc_config)
            if impl == FLOOR:
                products = floor_products(rmc_config, steps, batch, device)
                record["products"] = {k: [p._asdict() for p in v] for k, v in products.items()}
        records.append(record)
        print(progress_row(record), flush=True)
    return records
