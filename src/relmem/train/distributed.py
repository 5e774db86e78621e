"""Data-parallel plumbing for ``torchrun``: process group, device per rank, reductions.

The same ``relmem train`` command runs single-process or under ``torchrun --nproc_per_node N``;
the launcher's ``WORLD_SIZE``/``RANK``/``LOCAL_RANK`` variables switch DDP on. NCCL is used on
CUDA, gloo elsewhere (the test suite runs 2 CPU processes with gloo).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    """This process's place in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """'auto' → cuda, then mps, then cpu; 'cuda' picks ``cuda:local_rank``.

    Raises:
        ValueError: the requested accelerator is not available.
    """
    if name == "auto":
        if torch.cuda.is_available():
            name = "cuda"
        elif torch.backends.mps.is_available():
            name = "mps"
        else:
            name = "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' requested but CUDA is not available")
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    if name == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError("device 'mps' requested but MPS is not available")
        return torch.device("mps")
    if name != "cpu":
        raise ValueError(f"unknown device {name!r}; use auto, cpu, cuda or mps")
    return torch.device("cpu")


def init_distributed(device_name: str) -> tuple[DistInfo, torch.device]:
    """Start the process group when launched by torchrun; pick this rank's device."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistInfo(), resolve_device(device_name)
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_name, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return DistInfo(rank, world_size, local_rank), device


def shutdown_distributed() -> None:
    """Destroy the process group if this process started one."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(tensor: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Sum ``tensor`` over ranks in place (a no-op single-process)."""
    if info.enabled:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_reduce_max(tensor: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Max of ``tensor`` over ranks in place (a no-op single-process)."""
    if info.enabled:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor


def barrier(info: DistInfo) -> None:
    """Wait for every rank (a no-op single-process)."""
    if info.enabled:
        dist.barrier()


def all_gather_rows(tensor: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Every rank's ``tensor [b, ...]`` concatenated in rank order, ``[world_size·b, ...]``."""
    if not info.enabled:
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(info.world_size)]
    dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts)
