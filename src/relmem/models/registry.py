"""The core registry: a name maps to a config dataclass and a builder of a recurrent core.

A core is any module with the contract every model relies on:

- ``core(inputs [B, T, F], state=None, *, lengths=None) -> (outputs [B, T, H], state)``:
  batch-first, ``state`` None means the core's initial state, the returned state is the one
  after each example's last valid step (``lengths [B]``), outputs at padded steps are zeros;
- ``core.output_size``: H; ``core.initial_state(batch_size, device=...) -> state``, a tensor
  or (named) tuple of tensors, each batch-leading.

A core joins with one decorated builder in its own file under :mod:`relmem.models` (see
:mod:`relmem.models.rmc`); the training config then gets an option group of its name
(``--rmc.mem-slots``) without further edits, and every task can train it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

CoreBuilder = Callable[[Any, int, "int | None"], nn.Module]


@dataclass(frozen=True)
class ModelEntry:
    """A registered core.

    Attributes:
        name: the ``--model`` choice and the config's option group.
        config_cls: the core's config dataclass (every field has a default).
        build: ``build(config, input_size, readout_size) -> core``. ``readout_size`` is None,
            or (only for cores with ``readout``) the width the core's own final linear layer
            must emit, so a linear head is folded into it.
        readout: the core ends in a linear layer of any width (the DNC's output layer).
    """

    name: str
    config_cls: type
    build: CoreBuilder
    readout: bool = False


_MODELS: dict[str, ModelEntry] = {}


def register_model(
    name: str, config_cls: type, *, readout: bool = False
) -> Callable[[CoreBuilder], CoreBuilder]:
    """Decorator registering ``build(config, input_size, readout_size) -> core`` as ``name``."""

    def decorator(build: CoreBuilder) -> CoreBuilder:
        if name in _MODELS:
            raise ValueError(f"model {name!r} is already registered")
        _MODELS[name] = ModelEntry(name, config_cls, build, readout)
        return build

    return decorator


def get_model(name: str) -> ModelEntry:
    """The registered core ``name``; a ``KeyError`` listing the known ones otherwise."""
    if name not in _MODELS:
        raise KeyError(f"unknown model {name!r}; known models: {', '.join(list_models())}")
    return _MODELS[name]


def list_models() -> list[str]:
    """Names of every registered core, sorted."""
    return sorted(_MODELS)
