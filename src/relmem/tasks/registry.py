"""Where tasks and their presets join the trainer: two registries filled by decorators.

A task module registers its builder (``@register_task('copy', CopyConfig)``) and, next to it,
its named training configurations (``@register_preset('copy', 'cpu', default=True)`` above a
function returning a :class:`~relmem.train.config.TrainConfig`). ``relmem train TASK --preset
NAME`` accepts the CLI name (``cpu``, ``paper``, ``dnc-cpu``) or the function's name, the
library name (``copy_cpu``). Importing :mod:`relmem.tasks` fills both tables.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from relmem.tasks.base import Task
from relmem.train.config import TrainConfig

Builder = Callable[[Any], Task]
Preset = Callable[[], TrainConfig]
PresetT = TypeVar("PresetT", bound=Preset)


@dataclass(frozen=True)
class TaskEntry:
    """A registered task: its CLI name, config dataclass and builder ``build(config)``.

    ``trainer`` builds the :class:`~relmem.train.trainer.Trainer` that trains it (the
    subclass, or a function with its constructor's arguments; None: the supervised trainer);
    reinforcement-learning tasks give theirs (``docs/rl.md`` §4).
    """

    name: str
    config_cls: type
    build: Builder
    trainer: type | None = None


@dataclass(frozen=True)
class PresetEntry:
    """A registered preset: its task, CLI name, library name and function."""

    task: str
    name: str
    function: Preset

    @property
    def library_name(self) -> str:
        """The function's name (``nth_farthest_cpu``)."""
        return self.function.__name__


_TASKS: dict[str, TaskEntry] = {}
_PRESETS: dict[str, dict[str, PresetEntry]] = {}  # task -> CLI name -> entry
_DEFAULTS: dict[str, str] = {}  # task -> CLI name of its default preset
_UNAVAILABLE: dict[str, str] = {}  # task -> what it needs (a missing extra)


def mark_unavailable(name: str, needs: str) -> None:
    """Record that task ``name`` exists but cannot be loaded here, and what it ``needs`` (an
    extra to install): :func:`get_task` then says so instead of "unknown task"."""
    _UNAVAILABLE[name] = needs


def register_task(
    name: str, config_cls: type, *, trainer: type | None = None
) -> Callable[[Builder], Builder]:
    """Decorator registering ``build(config) -> Task`` under ``name`` (the CLI's task name),
    trained by ``trainer`` (None: the supervised :class:`~relmem.train.trainer.Trainer`)."""

    def decorator(build: Builder) -> Builder:
        if name in _TASKS:
            raise ValueError(f"task {name!r} is already registered")
        _TASKS[name] = TaskEntry(name, config_cls, build, trainer)
        return build

    return decorator


def register_preset(task: str, name: str, *, default: bool = False) -> Callable[[PresetT], PresetT]:
    """Decorator registering a preset function of ``task`` under the CLI name ``name``.

    ``default=True`` makes it what ``relmem train TASK`` uses without ``--preset``.
    """

    def decorator(function: PresetT) -> PresetT:
        table = _PRESETS.setdefault(task, {})
        if name in table:
            raise ValueError(f"preset {name!r} of task {task!r} is already registered")
        if default and task in _DEFAULTS:
            raise ValueError(f"task {task!r} already has a default preset, {_DEFAULTS[task]!r}")
        table[name] = PresetEntry(task, name, function)
        if default:
            _DEFAULTS[task] = name
        return function

    return decorator


@contextmanager
def registered(
    name: str,
    config_cls: type,
    build: Builder,
    presets: dict[str, Preset] | None = None,
    trainer: type | None = None,
) -> Iterator[TaskEntry]:
    """Register a task (and presets; the first is its default) for the ``with`` block only.

    Tests use it so that their tasks do not leak into other tests.
    """
    register_task(name, config_cls, trainer=trainer)(build)
    for i, (preset_name, function) in enumerate((presets or {}).items()):
        register_preset(name, preset_name, default=i == 0)(function)
    try:
        yield _TASKS[name]
    finally:
        del _TASKS[name]
        _PRESETS.pop(name, None)
        _DEFAULTS.pop(name, None)


def get_task(name: str) -> TaskEntry:
    """The registered task called ``name``; a ``KeyError`` listing the known ones otherwise."""
    if name not in _TASKS:
        if name in _UNAVAILABLE:
            raise KeyError(f"task {name!r} {_UNAVAILABLE[name]}")
        raise KeyError(f"unknown task {name!r}; known tasks: {', '.join(sorted(_TASKS))}")
    return _TASKS[name]


def list_tasks() -> list[str]:
    """Names of every registered task, sorted."""
    return sorted(_TASKS)


def list_presets(task: str) -> list[PresetEntry]:
    """The presets of ``task``, the default first, then in registration order."""
    table = _PRESETS.get(task, {})
    default = _DEFAULTS.get(task)
    return sorted(table.values(), key=lambda entry: entry.name != default)


def default_preset(task: str) -> PresetEntry:
    """The preset ``relmem train TASK`` starts from; a ``KeyError`` if ``task`` has none."""
    if task not in _DEFAULTS:
        raise KeyError(f"task {task!r} has no default preset")
    return _PRESETS[task][_DEFAULTS[task]]


def get_preset(task: str, name: str) -> TrainConfig:
    """A fresh config from preset ``name`` (CLI or library name) of ``task``.

    Raises:
        KeyError: naming the task's presets (a preset of another task is refused too).
    """
    for entry in list_presets(task):
        if name in (entry.name, entry.library_name):
            return entry.function()
    known = [n for e in list_presets(task) for n in (e.name, e.library_name)]
    raise KeyError(f"unknown preset {name!r} for task {task!r}; known presets: {', '.join(known)}")
