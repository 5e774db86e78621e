"""``relmem bench --core dnc``: the DNC's configurations and what each is timed against.

Implementations, all timed side by side in one process (:func:`run_dnc_config`):

- ``reference``: the module with ``implementation='reference'`` (the memory step in eager ops,
  the oracle of the tests);
- ``fused``: the default path (``implementation='auto'``): the memory step as one C++ operator
  (:mod:`relmem.cores.dnc.fused`), on the CPU;
- ``lstm-params``: an ``nn.LSTM`` from the input whose parameter count comes closest to the
  reference's;
- ``matmul-floor``: the step's GEMMs and batched products alone (:func:`dnc_floor_passes`);
- ``pytorch-dnc``: ixaxaar's ``pytorch-dnc`` (the PyPI package ``dnc``, the ``bench`` extra)
  at the same sizes, when it is installed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from relmem.benchmarking.baselines import lstm_hidden_for_params
from relmem.benchmarking.configs import FLOOR, PYTORCH_DNC
from relmem.benchmarking.report import progress_row
from relmem.benchmarking.timing import builds, time_modules
from relmem.cores.dnc import DNC, MemoryControllerLayer
from relmem.cores.dnc.fused import load_dnc_ops
from relmem.cores.dnc.memory import interface_layout

DNC_IMPLEMENTATIONS = ("reference", "fused", "lstm-params", FLOOR, PYTORCH_DNC)


@dataclass(frozen=True)
class DNCBenchConfig:
    """One DNC configuration.

    Attributes:
        module: 'dnc' (:class:`relmem.DNC`, an LSTM controller) or 'layer'
            (:class:`relmem.MemoryControllerLayer`, a GRU controller, as the reader runs it).
        sizes: the module's keyword arguments.
        shape: ``(T, B)``.
        note: where it comes from.
    """

    module: str
    sizes: dict[str, Any]
    shape: tuple[int, int]
    note: str

    @property
    def input_size(self) -> int:
        return int(self.sizes["input_size" if self.module == "dnc" else "d_model"])


DNC_CONFIGS: dict[str, DNCBenchConfig] = {
    "repeat-copy": DNCBenchConfig(
        "dnc",
        {
            "input_size": 6,
            "hidden_size": 64,
            "memory_size": 16,
            "word_size": 16,
            "num_read_heads": 4,
            "clip_value": 20.0,
        },
        (20, 16),
        "deepmind/dnc's repeat-copy defaults (controller 64, N=16, W=16, R=4, batch 16), as "
        "the repeat-copy preset",
    ),
    "copy": DNCBenchConfig(
        "dnc",
        {
            "input_size": 10,
            "hidden_size": 64,
            "memory_size": 32,
            "word_size": 16,
            "num_read_heads": 1,
            "clip_value": 20.0,
        },
        (43, 16),
        "the copy preset: 8 bits, patterns up to 20 (43 steps), controller 64, N=32, W=16, R=1, "
        "batch 16",
    ),
    "reader-cpu": DNCBenchConfig(
        "layer",
        {"d_model": 96, "memory_slots": 16, "word_size": 32, "read_heads": 2},
        (250, 32),
        "the squad cpu preset's memory controller layer (D=96, GRU, N=16, W=32, R=2) at its "
        "batch of 32 over a 250-token padded context",
    ),
    "reader-paper": DNCBenchConfig(
        "layer",
        {"d_model": 200, "memory_slots": 128, "word_size": 64, "read_heads": 4},
        (200, 8),
        "MemoReader's memory (the squad paper preset: D=200, GRU, N=128, W=64, R=4), batch 8 "
        "over 200 tokens",
    ),
}


def _build(config: DNCBenchConfig, implementation: str, device: torch.device) -> nn.Module:
    if config.module == "dnc":
        return DNC(**config.sizes, implementation=implementation, device=device)
    return MemoryControllerLayer(**config.sizes, implementation=implementation, device=device)


class _PytorchDNC(nn.Module):
    """ixaxaar's ``dnc.DNC`` shaped like the others: ``[T, B, X]`` in, ``(output, state)`` out."""

    def __init__(self, config: DNCBenchConfig) -> None:
        super().__init__()
        from dnc import DNC as Ported  # the optional `dnc` package

        sizes = config.sizes
        layer = config.module == "layer"
        self.module = Ported(
            input_size=config.input_size,
            hidden_size=sizes["d_model"] if layer else sizes["hidden_size"],
            rnn_type="gru" if layer else "lstm",
            num_layers=1,
            num_hidden_layers=1,
            batch_first=False,
            nr_cells=sizes["memory_slots" if layer else "memory_size"],
            cell_size=sizes["word_size"],
            read_heads=sizes["read_heads" if layer else "num_read_heads"],
            gpu_id=-1,
        )

    def forward(self, inputs: Tensor) -> tuple[Tensor, Any]:
        output, (controller, memory, reads) = self.module(inputs, reset_experience=True)
        return output, (controller, tuple(memory.values()), reads)


def pytorch_dnc_available() -> bool:
    """Whether ixaxaar's ``pytorch-dnc`` (the ``dnc`` package) is importable (its class, not
    just a folder named ``dnc`` on the path, such as a checkout's ``tests/dnc``)."""
    try:
        from dnc import DNC  # noqa: F401
    except ImportError:
        return False
    return True


class Product(NamedTuple):
    """One product of the step: ``batch`` independent ``[m, k] @ [k, n]`` (batch 0: a GEMM
    with a weight, whose gradient is summed over every step)."""

    batch: int
    m: int
    k: int
    n: int


def floor_products(config: DNCBenchConfig, batch: int) -> dict[str, list[Product]]:
    """The step's products (``loop``: every step; ``hoisted``: once over T·B rows).

    Controller (input and recurrent GEMMs), interface, the output GEMM (the DNC) or the
    layer's three projections (hoisted), content addressing (write and read keys against the
    memory), the dense link's two directional products and the read.
    """
    s = config.sizes
    layer = config.module == "layer"
    x = config.input_size
    h = s["d_model"] if layer else s["hidden_size"]
    n = s["memory_slots" if layer else "memory_size"]
    w = s["word_size"]
    r = s["read_heads" if layer else "num_read_heads"]
    interface = interface_layout(w, r, 1).size
    gates = 3 * h if layer else 4 * h
    loop = [
        Product(0, batch, x + r * w, gates),
        Product(0, batch, h, gates),
        Product(0, batch, h, interface),
        Product(batch, 1, w, n),  # write content
        Product(batch, r, w, n),  # read content
        Product(batch, r, n, n),  # forward weights
        Product(batch, r, n, n),  # backward weights
        Product(batch, r, n, w),  # read
    ]
    hoisted = []
    if layer:
        hoisted = [Product(0, 1, h, h), Product(0, 1, r * w, h), Product(0, 1, h, h)]
    else:
        loop.append(Product(0, batch, h + r * w, h))
    return {"loop": loop, "hoisted": hoisted}


def dnc_floor_passes(
    config: DNCBenchConfig, steps: int, batch: int, device: torch.device
) -> dict[str, Callable[[], None]]:
    """:func:`floor_products` alone, as timed passes: ``forward`` runs each loop product once
    per step and each hoisted one over T·B rows; ``train`` adds, per step, the input gradient
    of each GEMM and both operands' gradients of each batched product, then each weight's
    gradient over all T·B rows. No autograd, no elementwise work, no sort."""
    products = floor_products(config, batch)
    generator = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=generator).to(device)

    def operands(p: Product, rows: int) -> tuple[Tensor, Tensor, Tensor]:
        if p.batch:
            return rand(p.batch, p.m, p.k), rand(p.batch, p.k, p.n), rand(p.batch, p.m, p.n)
        return rand(rows * p.m, p.k), rand(p.n, p.k), rand(rows * p.m, p.n)

    loop = [operands(p, 1) for p in products["loop"]]
    weights_all = [
        (rand(steps * p.m, p.k), rand(steps * p.m, p.n)) for p in products["loop"] if not p.batch
    ]
    hoisted = [operands(p, steps * batch) for p in products["hoisted"]]

    def forward() -> None:
        for a, b, _ in hoisted:
            torch.mm(a, b.t())
        for _ in range(steps):
            for a, b, _ in loop:
                torch.bmm(a, b) if a.dim() == 3 else torch.mm(a, b.t())

    def train() -> None:
        forward()
        for _ in range(steps):
            for a, b, g in loop:
                if a.dim() == 3:
                    torch.bmm(g, b.transpose(1, 2))
                    torch.bmm(a.transpose(1, 2), g)
                else:
                    torch.mm(g, b)
        for x_all, g_all in weights_all:
            torch.mm(g_all.t(), x_all)
        for a, b, g in hoisted:
            torch.mm(g, b)
            torch.mm(g.t(), a)

    return {"forward": forward, "train": train}


def implementations(
    config: DNCBenchConfig, device: torch.device, only: Collection[str] | None
) -> dict[str, nn.Module]:
    """The modules to time: ``reference`` and ``fused`` share parameters; ``fused`` where its
    operator builds (else it is skipped, with the reason on stderr); ``pytorch-dnc`` where the
    ``dnc`` package is installed."""
    torch.manual_seed(0)
    reference = _build(config, "reference", device)
    impls: dict[str, nn.Module] = {"reference": reference}
    if (not only or "fused" in only) and builds(load_dnc_ops):
        impls["fused"] = _build(config, "fused", device)
        impls["fused"].load_state_dict(reference.state_dict())
    params = sum(p.numel() for p in reference.parameters())
    x = config.input_size
    impls["lstm-params"] = nn.LSTM(x, lstm_hidden_for_params(x, params), device=device)
    if (not only or PYTORCH_DNC in only) and pytorch_dnc_available():
        torch.manual_seed(0)
        impls[PYTORCH_DNC] = _PytorchDNC(config).to(device)
    return impls


def run_dnc_config(
    name: str,
    device: torch.device,
    *,
    steps: int | None = None,
    batch: int | None = None,
    only: Collection[str] | None = None,
    warmup: int = 1,
    repeat: int = 5,
) -> list[dict[str, Any]]:
    """Time every implementation of one DNC configuration; one record per implementation
    (the RMC's record layout: :func:`relmem.benchmarking.runner.run_config`)."""
    config = DNC_CONFIGS[name]
    steps, batch = steps or config.shape[0], batch or config.shape[1]
    impls = implementations(config, device, only)
    selected = {k: v for k, v in impls.items() if not only or k in only}
    torch.manual_seed(1)
    inputs = torch.randn(steps, batch, config.input_size, device=device)
    floor = (
        {FLOOR: dnc_floor_passes(config, steps, batch, device)} if not only or FLOOR in only else {}
    )
    timings = time_modules(selected, inputs, floor, device, warmup, repeat)
    reference_params = sum(p.numel() for p in impls["reference"].parameters())
    records = []
    for impl in timings:
        module = selected.get(impl)
        record = {
            "core": "dnc",
            "config": name,
            "implementation": impl,
            "device": str(device),
            "dtype": "float32",
            "steps": steps,
            "batch": batch,
            "module": config.module,
            "sizes": config.sizes,
            "note": config.note,
            "parameters": reference_params
            if module is None
            else sum(p.numel() for p in module.parameters()),
            **timings[impl],
        }
        if isinstance(module, nn.LSTM):
            record["lstm_hidden"] = module.hidden_size
        if impl == FLOOR:
            record["products"] = {
                k: [p._asdict() for p in v] for k, v in floor_products(config, batch).items()
            }
        records.append(record)
        print(progress_row(record), flush=True)
    return records
