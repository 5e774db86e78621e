"""The model registry: a name maps to a config dataclass and a builder.

A builder is ``build(model_config, head_config, task_spec) -> nn.Module``; the module's
``forward(inputs, lengths=None)`` maps ``inputs [B, T, F]`` (batch-first, right-padded to the
optional ``lengths [B]``) to ``logits [B, C]`` for a last-step task or ``[B, T, O]`` for a
per-step task (``task_spec.output``). The trainer's ``--model`` choices, the checkpoint loader
and the parametrised tests all read this table, so a new core joins with one decorated function
(see :mod:`relmem.models.builders`), one config dataclass and a field of that name on
``TrainConfig``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from relmem.models.spec import TaskSpec

Builder = Callable[[Any, Any, TaskSpec], nn.Module]


@dataclass(frozen=True)
class ModelEntry:
    """A registered model: its name, config dataclass and builder."""

    name: str
    config_cls: type
    build: Builder


_MODELS: dict[str, ModelEntry] = {}


def register_model(name: str, config_cls: type) -> Callable[[Builder], Builder]:
    """Decorator registering ``build(model_config, head_config, task_spec)`` under ``name``.

    ``config_cls`` is the model's config dataclass; the training config holds one instance per
    registered model under the same name (``--rmc.mem-slots``, ``--lstm.hidden-size``).
    """

    def decorator(build: Builder) -> Builder:
        if name in _MODELS:
            raise ValueError(f"model {name!r} is already registered")
        _MODELS[name] = ModelEntry(name, config_cls, build)
        return build

    return decorator


def get_model(name: str) -> ModelEntry:
    """The registered model ``name``; a ``KeyError`` listing the known ones otherwise."""
    if name not in _MODELS:
        raise KeyError(f"unknown model {name!r}; known models: {', '.join(list_models())}")
    return _MODELS[name]


def list_models() -> list[str]:
    """Names of every registered model, sorted."""
    return sorted(_MODELS)
