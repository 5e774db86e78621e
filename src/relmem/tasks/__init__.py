"""Training tasks: a generic :class:`Task` interface, a registry and the paper's tasks."""

from relmem.tasks.base import (
    Batch,
    MetricSpec,
    Task,
    TaskSpec,
    get_task,
    list_tasks,
    register_task,
)
from relmem.tasks.copy_tasks import (
    AssociativeRecall,
    RepeatCopy,
    TaskBatch,
    bit_errors,
    copy_task,
    masked_sigmoid_cross_entropy,
)
from relmem.tasks.memory_tasks import (
    AssociativeRecallConfig,
    AssociativeRecallTask,
    CopyConfig,
    RepeatCopyConfig,
    RepeatCopyTask,
)
from relmem.tasks.nth_farthest import NthFarthest, NthFarthestConfig, generate

__all__ = [
    "AssociativeRecall",
    "AssociativeRecallConfig",
    "AssociativeRecallTask",
    "Batch",
    "CopyConfig",
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
    "get_task",
    "list_tasks",
    "masked_sigmoid_cross_entropy",
    "register_task",
]
