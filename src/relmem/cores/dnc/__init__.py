"""The DNC-style external memory (``docs/dnc.md``).

- :mod:`~relmem.cores.dnc.addressing`: pure tensor functions (content, usage, allocation, link).
- :class:`DNCMemory`: interface vector in, read vectors and new memory state out.
- :class:`DNCCell` / :class:`DNC`: LSTM controller + memory, shaped like ``nn.LSTM``.
- :class:`MemoryControllerLayer`: MemoReader's residual memory controller layer.
"""

from relmem.cores.dnc.controller import Controller
from relmem.cores.dnc.dnc import DNC, DNCCell, DNCState
from relmem.cores.dnc.layer import MemoryControllerLayer
from relmem.cores.dnc.memory import DNCMemory, DNCMemoryState, Interface, interface_layout

__all__ = [
    "DNC",
    "Controller",
    "DNCCell",
    "DNCMemory",
    "DNCMemoryState",
    "DNCState",
    "Interface",
    "MemoryControllerLayer",
    "interface_layout",
]
