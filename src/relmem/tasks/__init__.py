"""Training tasks: the :class:`Task` contract, the task and preset registries, the paper's tasks.

Importing this package registers every task below and its presets.
"""

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
