"""relmem: memory-augmented recurrent networks for PyTorch.

The Relational Memory Core of Santoro et al. 2018 (:class:`RelationalMemory`,
:class:`RelationalMemoryCell`), shaped like ``nn.LSTM`` and faithful to Sonnet v1.
"""

from relmem import sonnet
from relmem.cores import (
    RelationalMemory,
    RelationalMemoryCell,
    RMCConfig,
    RMCState,
    RMCStepDetails,
    detach_state,
)

__version__ = "0.1.0"

__all__ = [
    "RMCConfig",
    "RMCState",
    "RMCStepDetails",
    "RelationalMemory",
    "RelationalMemoryCell",
    "__version__",
    "detach_state",
    "sonnet",
]
