"""relmem: memory-augmented recurrent networks for PyTorch.

The Relational Memory Core of Santoro et al. 2018 (:class:`RelationalMemory`,
:class:`RelationalMemoryCell`), shaped like ``nn.LSTM`` and faithful to Sonnet v1; and the
Differentiable Neural Computer of Graves et al. 2016 (:class:`DNC`, :class:`DNCCell`,
:class:`DNCMemory`) with MemoReader's memory controller layer (:class:`MemoryControllerLayer`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

from relmem import sonnet
from relmem._version import __version__
from relmem.cores import (
    DNC,
    DNCCell,
    DNCMemory,
    DNCMemoryState,
    DNCState,
    MemoryControllerLayer,
    RelationalMemory,
    RelationalMemoryCell,
    RMCConfig,
    RMCState,
    RMCStepDetails,
    detach_state,
)


def load_pretrained(
    path_or_repo_id: str | os.PathLike[str],
    *,
    device: str | torch.device = "cpu",
    max_parameters: int | None = None,
    revision: str | None = None,
) -> Pretrained:
    """A model written by ``relmem export``, from its folder or (with the ``hub`` extra) a
    Hugging Face Hub repository id: ``model, vocabulary, task_name, config =
    relmem.load_pretrained(path)``. See :func:`relmem.pretrained.load_pretrained`."""
    from relmem.pretrained import load_pretrained as load

    return load(path_or_repo_id, device=device, max_parameters=max_parameters, revision=revision)


__all__ = [
    "DNC",
    "DNCCell",
    "DNCMemory",
    "DNCMemoryState",
    "DNCState",
    "MemoryControllerLayer",
    "RMCConfig",
    "RMCState",
    "RMCStepDetails",
    "RelationalMemory",
    "RelationalMemoryCell",
    "__version__",
    "detach_state",
    "load_pretrained",
    "sonnet",
]

if TYPE_CHECKING:
    from relmem.pretrained import Pretrained
