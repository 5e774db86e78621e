"""Training tasks: the :class:`Task` contract, the task and preset registries, the paper's tasks.

Importing this package imports every module in it, so every task and preset registers itself
(a new task's file needs no line here).
"""

import importlib
import pkgutil

from relmem.tasks.associative_recall import (
    AssociativeRecall,
    AssociativeRecallConfig,
    AssociativeRecallTask,
)
from relmem.tasks.base import Batch, Measure, MetricSpec, Task, TaskSpec
from relmem.tasks.bits import TaskBatch, bit_errors, masked_sigmoid_cross_entropy
from relmem.tasks.nth_farthest import NthFarthest, NthFarthestConfig, generate
from relmem.tasks.registry import (
    get_preset,
    get_task,
    list_presets,
    list_tasks,
    register_preset,
    register_task,
)
from relmem.tasks.repeat_copy import (
    CopyConfig,
    RepeatCopy,
    RepeatCopyConfig,
    RepeatCopyTask,
    copy_task,
)

__all__ = [
    "AssociativeRecall",
    "AssociativeRecallConfig",
    "AssociativeRecallTask",
    "Batch",
    "CopyConfig",
    "Measure",
    "MetricSpec",
    "NthFarthest",
    "NthFarthestConfig",
    "RepeatCopy",
    "RepeatCopyConfig",
    "RepeatCopyTask",
    "Task",
    "TaskBatch",
    "TaskSpec",
    "bit_errors",
    "copy_task",
    "generate",
    "get_preset",
    "get_task",
    "list_presets",
    "list_tasks",
    "masked_sigmoid_cross_entropy",
    "register_preset",
    "register_task",
]

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
