"""The interface every training task implements, and the task registry.

A task is a plain object built from its config dataclass. The training loop only ever calls the
methods of :class:`Task`, so a new task (copy, repeat-copy, Learning to Execute, ...) joins the
trainer by implementing them and calling :func:`register_task`. Its :class:`TaskSpec` says
whether the models emit one output per sequence (classification, ``logits [B, C]``) or one per
step (``logits [B, T, O]``), and its :class:`MetricSpec` names the metric the trainer reports.

Data is a pure function of ``(seed, step)``: :func:`step_generator` derives a fresh
``torch.Generator`` on the training device for every step, so a resumed run sees exactly the
batches an uninterrupted one would, with no generator state to carry around.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor

from relmem.models.spec import TaskSpec

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
    """One batch of a task, batch-first (every field's first axis is the batch).

    A last-step task (sequence classification, ``TaskSpec.output == 'last'``) fills the first
    three fields; a per-step task (copy, repeat copy, ...) also gives ``mask`` and ``lengths``.

    Attributes:
        inputs: ``[B, T, F]`` float32 model inputs.
        targets: ``[B]`` int64 class labels (last-step tasks) or ``[B, T, O]`` float targets
            (per-step tasks).
        groups: ``[B]`` int64 group ids in ``0..num_groups-1`` for per-group metrics (Nth
            Farthest: the rank of the asked-for object in the reference's ascending distance
            order), or None.
        mask: ``[B, T]`` float, 1 on the steps that are scored (per-step tasks), or None.
        lengths: ``[B]`` int64 valid lengths of right-padded sequences, or None (all T valid).
    """

    inputs: Tensor
    targets: Tensor
    groups: Tensor | None = None
    mask: Tensor | None = None
    lengths: Tensor | None = None

    def select(self, rows: Tensor | slice) -> Batch:
        """The examples ``rows`` of every field, with padding beyond their longest one removed.

        Trimming padded steps changes no result (they are unscored and leave the models'
        states alone) and saves their compute.
        """
        picked = Batch(*(None if t is None else t[rows] for t in self))
        if picked.lengths is None:
            return picked
        steps = int(picked.lengths.max())
        targets = picked.targets[:, :steps] if picked.targets.dim() > 1 else picked.targets
        mask = None if picked.mask is None else picked.mask[:, :steps]
        return picked._replace(inputs=picked.inputs[:, :steps], targets=targets, mask=mask)

    def to(self, device: torch.device) -> Batch:
        """Every field moved to ``device``."""
        return Batch(*(None if t is None else t.to(device) for t in self))


@dataclass(frozen=True)
class MetricSpec:
    """A task's primary metric, a key of :meth:`Task.metrics`.

    The trainer shows it in the progress bar and the summary, breaks it down by group and keeps
    its best value on fresh batches.

    Attributes:
        name: the key (``'accuracy'``); the trainer logs ``train/{name}``, ``eval/{name}``,
            ``eval/best_batch_{name}`` and writes ``held_out_{name}`` to ``summary.json``.
        higher_is_better: the direction ("best batch" is the maximum or the minimum).
        description: a readable name for tables and plots (``'bit errors per sequence'``).
        short: a few letters for the progress bar (``'acc'``).
        percent: show values as percentages.
    """

    name: str
    higher_is_better: bool
    description: str
    short: str
    percent: bool = False

    def format(self, value: float) -> str:
        """``'49.98%'`` for a percentage metric, ``'0.0312'`` otherwise."""
        return f"{100 * value:.2f}%" if self.percent else f"{value:.4g}"

    def improves(self, value: float, best: float) -> bool:
        """Whether ``value`` beats ``best`` (a NaN ``best`` means no value yet)."""
        if math.isnan(best):
            return not math.isnan(value)
        return value > best if self.higher_is_better else value < best


ACCURACY = MetricSpec("accuracy", True, "accuracy", "acc", percent=True)
BIT_ERRORS = MetricSpec("bit_errors", False, "bit errors per sequence", "bits")


class Task(Protocol):
    """A task the generic trainer can run.

    Attributes:
        spec: what the models need: sizes, and whether the output is per step.
        metric: the primary metric (a key of :meth:`metrics`) and its direction.
        group_name: what ``Batch.groups`` means, for eval tables.
        num_groups: the group ids lie in ``0..num_groups-1``.
    """

    spec: TaskSpec
    metric: MetricSpec
    group_name: str
    num_groups: int

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
        """Scalar loss of ``logits`` (``[B, C]`` or ``[B, T, O]``), a mean over the batch."""
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
