"""Synthetic and benchmark tasks."""

from relmem.tasks.copy_tasks import (
    AssociativeRecall,
    RepeatCopy,
    TaskBatch,
    bit_errors,
    copy_task,
    masked_sigmoid_cross_entropy,
)

__all__ = [
    "AssociativeRecall",
    "RepeatCopy",
    "TaskBatch",
    "bit_errors",
    "copy_task",
    "masked_sigmoid_cross_entropy",
]
