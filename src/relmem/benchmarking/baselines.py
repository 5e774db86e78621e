"""What ``relmem bench`` times the RMC against: ``nn.LSTM`` and the fast path's bare GEMMs."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from relmem.cores.rmc import RMCConfig, fast_path_products
from relmem.cores.rmc.fast import Product, fold_pays, hoist_chunk


def floor_products(
    config: RMCConfig, steps: int, batch: int, device: torch.device
) -> dict[str, list[Product]]:
    """:func:`fast_path_products` as the fast path runs them on ``[steps, batch]`` inputs on
    ``device``: folded (E13) where its hoisting chunks fold."""
    n, features = config.num_input_rows, config.input_size
    rows = torch.empty((), device=device).expand(steps, batch, n, features)
    chunk = rows[: hoist_chunk(config, rows)]
    return fast_path_products(config, folded=fold_pays(config, chunk))


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
    products = floor_products(config, steps, batch, device)
    generator = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=generator).to(device)

    def tensors(product: Product, rows: int) -> tuple[Tensor, Tensor, Tensor]:
        x = rand(rows * product.rows, product.inputs)
        return x, rand(product.outputs, product.inputs), rand(rows * product.rows, product.outputs)

    loop = [tensors(p, batch) for p in products["loop"]]
    loop_all = [
        (rand(steps * batch * p.rows, p.inputs), rand(steps * batch * p.rows, p.outputs))
        for p in products["loop"]
    ]
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
