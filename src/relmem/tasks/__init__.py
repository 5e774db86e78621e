"""Training tasks: a generic :class:`Task` interface, a registry and the paper's tasks."""

from relmem.tasks.base import Batch, Task, TaskSpec, get_task, list_tasks, register_task
from relmem.tasks.nth_farthest import NthFarthest, NthFarthestConfig, generate

__all__ = [
    "Batch",
    "NthFarthest",
    "NthFarthestConfig",
    "Task",
    "TaskSpec",
    "generate",
    "get_task",
    "list_tasks",
    "register_task",
]
