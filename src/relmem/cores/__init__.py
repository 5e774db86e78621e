"""Recurrent cores: the Relational Memory Core, the DNC and shared sequence utilities."""

from relmem.cores.base import detach_state
from relmem.cores.dnc import (
    DNC,
    DNCCell,
    DNCMemory,
    DNCMemoryState,
    DNCState,
    MemoryControllerLayer,
)
from relmem.cores.rmc import (
    RelationalMemory,
    RelationalMemoryCell,
    RMCConfig,
    RMCState,
    RMCStepDetails,
)

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
    "detach_state",
]
