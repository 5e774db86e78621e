"""The interface every training task implements, and the task registry.

A task is a plain object built from its config dataclass. The training loop only ever calls the
methods of :class:`Task`, so a new task (copy, repeat-copy, Learning to Execute, ...) joins the
trainer by implementing them and calling :func:`register_task`.

Data is a pure function of ``(seed, step)``: :func:`step_generator` derives a fresh
``torch.Generator`` on the training device for every step, so a resumed run sees exactly the
batches an uninterrupted one would, with no generator state to carry around.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def derive_seed(*keys: int) -> int:
    """Mix integer keys (seed, stream, step, ...) into one 63-bit seed, SplitMix64-style."""
    h = 0
    for key in keys:
        h = _splitmix64(h ^ (int(key) & _MASK64))
    return h >> 1


def step_generator(device: torch.device, *keys: int) -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded from :func:`derive_seed` of ``keys``."""
    generator = torch.Generator(device=device)
    generator.manual_seed(derive_seed(*keys))
    return generator


class Batch(NamedTuple):
    """One batch of a sequence-classification task.

    Attributes:
        inputs: ``[B, T, F]`` float32 model inputs, batch-first.
        targets: ``[B]`` int64 class labels.
        groups: ``[B]`` int64 group ids for per-group metrics (Nth Farthest: the rank of the
            asked-for object in the reference's ascending distance order), or None.
    """

    inputs: Tensor
    targets: Tensor
    groups: Tensor | None = None


@dataclass(frozen=True)
class TaskSpec:
    """What a model builder needs to know about a task.

    Attributes:
        input_size: F, features per time step.
        seq_len: T, time steps per sequence (the model reads all of them).
        num_classes: C, the size of the output layer.
    """

    input_size: int
    seq_len: int
    num_classes: int


class Task(Protocol):
    """A task the generic trainer can run."""

    spec: TaskSpec
    group_name: str  # what ``Batch.groups`` means, for eval tables

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        """Draw a fresh batch on ``generator.device``."""
        ...

    def held_out(self, device: torch.device) -> Batch:
        """The fixed held-out set (the same on every call, rank and machine)."""
        ...

    def group_label(self, group: int) -> str:
        """A readable name for a value of ``Batch.groups`` (eval tables)."""
        ...

    def loss(self, logits: Tensor, batch: Batch) -> Tensor:
        """Scalar mean loss of ``logits [B, C]``."""
        ...

    def metrics(self, logits: Tensor, batch: Batch) -> dict[str, Tensor]:
        """Per-example metric values, each ``[B]`` (averaged by the caller)."""
        ...


@dataclass(frozen=True)
class TaskEntry:
    """A registered task: its config dataclass, a builder and the default preset's name."""

    name: str
    config_cls: type
    build: Callable[[Any], Task]
    default_preset: str


_TASKS: dict[str, TaskEntry] = {}


def register_task(
    name: str, config_cls: type, default_preset: str
) -> Callable[[Callable[[Any], Task]], Callable[[Any], Task]]:
    """Decorator registering ``build(config) -> Task`` under ``name`` (the CLI's task name)."""

    def decorator(build: Callable[[Any], Task]) -> Callable[[Any], Task]:
        if name in _TASKS:
            raise ValueError(f"task {name!r} is already registered")
        _TASKS[name] = TaskEntry(name, config_cls, build, default_preset)
        return build

    return decorator


def get_task(name: str) -> TaskEntry:
    """The registered task called ``name``; a ``KeyError`` listing the known ones otherwise."""
    if name not in _TASKS:
        raise KeyError(f"unknown task {name!r}; known tasks: {', '.join(sorted(_TASKS))}")
    return _TASKS[name]


def list_tasks() -> list[str]:
    """Names of every registered task, sorted."""
    return sorted(_TASKS)
