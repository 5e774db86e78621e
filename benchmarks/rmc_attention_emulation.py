"""How far the fast path's float32 gradients would land from float64 if its attention kernel
multiplied at a lower precision than IEEE float32, emulated on the CPU (``docs/performance.md``
§4.15).

On CUDA the fast path hands its attention to ``scaled_dot_product_attention``, whose float32
kernel (memory-efficient attention; flash and cuDNN take no float32) runs its products on
tensor cores, and recomputes the softmax in the backward pass from the saved log-sum-exp. This
script runs the fast path in float64 with the attention replaced by one whose every product
rounds its operands first:

- ``fp32``: to float32 (an IEEE float32 kernel, accumulation exact);
- ``3xtf32``: CUTLASS's "fast float32", ``a·b ≈ A·B + A·b' + a'·B`` with ``A`` the TF32 rounding
  of ``a`` and ``a'`` that of ``a − A``;
- ``tf32``: to TF32 (10 mantissa bits), as with ``allow_tf32``;

forward and backward (the backward recomputes the probabilities from the log-sum-exp as the
kernel does), and prints each case's relative error of the input gradient and the worst other
gradient against float64, over seeds, with the test's data (``benchmarks/rmc_precision.py``).

``--bf16`` prints instead, for bf16 autocast (the test's bf16 modes, weights unperturbed), the
input gradient's error of the reference under autocast, of the fast path, and of the fast
path with its attention as the GPU run of §4.12 had it (git ``4d8cc4a``, before ``0f5b710``):
``scaled_dot_product_attention`` inside the autocast region, wholly in bf16.

    PYTHONPATH=src python benchmarks/rmc_attention_emulation.py --seeds $(seq 0 15)
    PYTHONPATH=src python benchmarks/rmc_attention_emulation.py --bf16 --seeds $(seq 0 15)
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
from unittest import mock

import torch
from rmc_precision import CASES, build, problem  # benchmarks/ is the script's own folder
from torch import Tensor

from relmem.benchmarking.precision import Autocast, relative_errors, run_with_gradients
from relmem.cores.rmc import FastRelationalMemory
from relmem.cores.rmc import fast as fast_module

MODES = ("fp32", "3xtf32", "tf32")


def tf32(x: Tensor) -> Tensor:
    """``x`` rounded to TF32 (10 mantissa bits, to nearest, ties away), as float64."""
    bits = x.float().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32).double()


def matmul(a: Tensor, b: Tensor, mode: str) -> Tensor:
    """``a @ b`` with the operands rounded as ``mode`` says, accumulated in float64."""
    if mode == "fp32":
        return a.float().double() @ b.float().double()
    big_a, big_b = tf32(a), tf32(b)
    if mode == "tf32":
        return big_a @ big_b
    return big_a @ big_b + big_a @ tf32(b - big_b) + tf32(a - big_a) @ big_b


class Attention(torch.autograd.Function):
    """Softmax attention whose products round as ``mode`` says; ``[B, H, R_q, K]`` queries,
    ``[B, H, R, K]`` keys, ``[B, H, R, D]`` values; the backward recomputes the probabilities
    from the saved log-sum-exp."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, scale: float, mode: str) -> Tensor:
        s = matmul(q, k.transpose(-1, -2), mode) * scale  # [B, H, R_q, R]
        lse = torch.logsumexp(s, dim=-1, keepdim=True)
        out = matmul(torch.exp(s - lse), v, mode)  # [B, H, R_q, D]
        ctx.save_for_backward(q, k, v, lse, out)
        ctx.scale, ctx.mode = scale, mode
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, lse, out = ctx.saved_tensors
        scale, mode = ctx.scale, ctx.mode
        p = torch.exp(matmul(q, k.transpose(-1, -2), mode) * scale - lse)
        grad_v = matmul(p.transpose(-1, -2), grad, mode)
        grad_p = matmul(grad, v.transpose(-1, -2), mode)
        grad_s = p * (grad_p - (grad * out).sum(-1, keepdim=True))
        grad_q = matmul(grad_s, k, mode) * scale
        grad_k = matmul(grad_s.transpose(-1, -2), q, mode) * scale
        return grad_q, grad_k, grad_v, None, None


def attend_as_at_4d8cc4a(z: Tensor, num_queries: int, heads: int, key: int, value: int) -> Tensor:
    """``relmem.cores.rmc.fast._attend`` before ``0f5b710``: SDPA under the caller's autocast
    (so wholly in bf16 under a bf16 autocast); ``z [B, R, Q]``, returns ``[B, R_q, M]``."""
    batch, rows, _ = z.shape
    z = z.view(batch, rows, heads, 2 * key + value).transpose(1, 2)  # [B, H, R, 2K+D]
    q, k, v = z.split([key, key, value], dim=-1)
    q = q[:, :, :num_queries]  # [B, H, R_q, K]
    if rows == 2:  # E7, as now (autocast does not reach its element-wise ops)
        k0, k1 = k.unbind(2)
        v0, v1 = v.unbind(2)
        logit = (q * (k0 - k1).unsqueeze(2)).sum(-1, keepdim=True) * key**-0.5
        out = v1.unsqueeze(2) + torch.sigmoid(logit) * (v0 - v1).unsqueeze(2)
    else:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=key**-0.5)
    return out.transpose(1, 2).reshape(batch, num_queries, heads * value)


def bf16_table(cases: list[str], seeds: list[int]) -> None:
    """The input gradient's error against float64 under bf16 autocast, per case and run."""
    print("| case | run | input grad: median | largest | seeds > 0.06 |")
    print("|---|---|---:|---:|---:|")
    for case in cases:
        base = build(case, randomise=False)  # the test's bf16 modes keep the initialisation
        found: dict[str, list[float]] = {}
        for seed in seeds:
            data = problem(base, seed, 7, 4)
            truth = run_with_gradients(copy.deepcopy(base).double(), data, "cpu", torch.float64)
            runs = {
                "reference": (Autocast(copy.deepcopy(base)), None),
                "fast": (
                    FastRelationalMemory(copy.deepcopy(base), matmul_dtype=torch.bfloat16),
                    None,
                ),
                "fast at 4d8cc4a": (
                    FastRelationalMemory(copy.deepcopy(base), matmul_dtype=torch.bfloat16),
                    attend_as_at_4d8cc4a,
                ),
            }
            for name, (module, attend) in runs.items():
                patch = mock.patch.object(fast_module, "_attend", attend) if attend else None
                with patch or contextlib.nullcontext():
                    got = run_with_gradients(module, data, "cpu", torch.float32)
                error = relative_errors(got[0], truth[0])["input grad"]
                found.setdefault(name, []).append(error)
        for name, errors in found.items():
            print(
                f"| {case} | {name} | {statistics.median(errors):.3f} | {max(errors):.3f} | "
                f"{sum(e > 0.06 for e in errors)} |",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--bf16", action="store_true", help="the bf16 table (see above)")
    args = parser.parse_args()
    if args.bf16:
        bf16_table(args.cases, args.seeds)
        return
    print("| case | attention | input grad: median | largest | worst other gradient: largest |")
    print("|---|---|---:|---:|---:|")
    for case in args.cases:
        base = build(case, randomise=True)  # the CUDA test's float32 modes perturb the weights
        found: dict[str, list[tuple[float, float]]] = {}
        for seed in args.seeds:
            data = problem(base, seed, 7, 4)
            truth = run_with_gradients(copy.deepcopy(base).double(), data, "cpu", torch.float64)
            for mode in MODES:

                def sdpa(q, k, v, scale, mode=mode):
                    return Attention.apply(q, k, v, scale, mode)

                fast = FastRelationalMemory(copy.deepcopy(base).double())
                target = "relmem.cores.rmc.fast.F.scaled_dot_product_attention"
                with mock.patch(target, sdpa):
                    got = run_with_gradients(fast, data, "cpu", torch.float64)
                quantities = relative_errors(got[0], truth[0])
                others = [v for k, v in quantities.items() if k != "input grad"]
                others += list(relative_errors(got[1], truth[1]).values())
                found.setdefault(mode, []).append((quantities["input grad"], max(others)))
        for mode, errors in found.items():
            inputs = [e[0] for e in errors]
            print(
                f"| {case} | {mode} | {statistics.median(inputs):.1e} | {max(inputs):.1e} | "
                f"{max(e[1] for e in errors):.1e} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
