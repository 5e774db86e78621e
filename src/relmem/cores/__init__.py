"""Recurrent cores: the Relational Memory Core and shared sequence utilities."""

from relmem.cores.base import detach_state
from relmem.cores.rmc import (
    RelationalMemory,
    RelationalMemoryCell,
    RMCConfig,
    RMCState,
    RMCStepDetails,
)

__all__ = [
    "RMCConfig",
    "RMCState",
    "RMCStepDetails",
    "RelationalMemory",
    "RelationalMemoryCell",
    "detach_state",
]
