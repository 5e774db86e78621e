"""The Relational Memory Core (Santoro et al. 2018).

Modules import one way: :mod:`~relmem.cores.rmc.config` (configuration, state, step details;
no modules) is read by :mod:`~relmem.cores.rmc.reference` (the step of ``docs/rmc.md`` §4,
the oracle) and :mod:`~relmem.cores.rmc.fast` (the fast path over the weights as data, its
plan, cost and FLOP models); :mod:`~relmem.cores.rmc.fused` (the fast path's step with its
small ops in C++ operators, ``csrc/``) reads ``fast``; :mod:`~relmem.cores.rmc.module` (the
``nn.Module``s that own the parameters) reads them all and dispatches on ``implementation``.
"""

from relmem.cores.rmc.config import (
    GateStyle,
    Implementation,
    QueryRows,
    RMCConfig,
    RMCState,
    RMCStepDetails,
)
from relmem.cores.rmc.fast import (
    BlockWeights,
    RMCWeights,
    deferral_pays,
    fast_cell_step,
    fast_path_plan,
    fast_path_products,
    fast_sequence,
    step_flops,
)
from relmem.cores.rmc.module import (
    FastRelationalMemory,
    RelationalMemory,
    RelationalMemoryCell,
    prefer_fused,
)
from relmem.cores.rmc.reference import AttentionBlock, AttentionMLP, reference_step

__all__ = [
    "AttentionBlock",
    "AttentionMLP",
    "BlockWeights",
    "FastRelationalMemory",
    "GateStyle",
    "Implementation",
    "QueryRows",
    "RMCConfig",
    "RMCState",
    "RMCStepDetails",
    "RMCWeights",
    "RelationalMemory",
    "RelationalMemoryCell",
    "deferral_pays",
    "fast_cell_step",
    "fast_path_plan",
    "fast_path_products",
    "fast_sequence",
    "prefer_fused",
    "reference_step",
    "step_flops",
]
