"""relmem: memory-augmented recurrent networks for PyTorch.

The Relational Memory Core of Santoro et al. 2018 (:class:`RelationalMemory`,
:class:`RelationalMemoryCell`), shaped like ``nn.LSTM`` and faithful to Sonnet v1; and the
Differentiable Neural Computer of Graves et al. 2016 (:class:`DNC`, :class:`DNCCell`,
:class:`DNCMemory`) with MemoReader's memory controller layer (:class:`MemoryControllerLayer`).
"""

from relmem import sonnet
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

__version__ = "0.1.0"

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
    "sonnet",
]
