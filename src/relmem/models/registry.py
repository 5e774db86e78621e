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
        architecture_only: only a registered architecture reads it (the reader's ``none``,
            no memory at all); ``encoder -> core -> head`` models refuse it, and
            :func:`list_models` leaves it out unless asked.
    """

    name: str
    config_cls: type
    build: CoreBuilder
    readout: bool = False
    architecture_only: bool = False


_MODELS: dict[str, ModelEntry] = {}


def register_model(
    name: str, config_cls: type, *, readout: bool = False, architecture_only: bool = False
) -> Callable[[CoreBuilder], CoreBuilder]:
    """Decorator registering ``build(config, input_size, readout_size) -> core`` as ``name``."""

    def decorator(build: CoreBuilder) -> CoreBuilder:
        if name in _MODELS:
            raise ValueError(f"model {name!r} is already registered")
        _MODELS[name] = ModelEntry(name, config_cls, build, readout, architecture_only)
        return build

    return decorator


def get_model(name: str) -> ModelEntry:
    """The registered core ``name``; a ``KeyError`` listing the known ones otherwise."""
    if name not in _MODELS:
        raise KeyError(f"unknown model {name!r}; known models: {', '.join(list_models(True))}")
    return _MODELS[name]


def list_models(every: bool = False) -> list[str]:
    """Names of every registered core, sorted; ``every=True`` adds those only an architecture
    reads (``--model`` choices such as the reader's ``none``)."""
    return sorted(name for name, entry in _MODELS.items() if every or not entry.architecture_only)


ArchitectureBuilder = Callable[[str, Any, Any, Any], nn.Module]
_ARCHITECTURES: dict[str, ArchitectureBuilder] = {}
# what an architecture reads of a core's section, by architecture and core: (fields, why)
_ARCHITECTURE_READS: dict[str, dict[str, tuple[tuple[str, ...], str]]] = {}


def register_architecture(
    name: str, *, reads: dict[str, tuple[tuple[str, ...], str]] | None = None
) -> Callable[[ArchitectureBuilder], ArchitectureBuilder]:
    """Decorator registering a model shape other than ``encoder -> core -> head`` that a task
    asks for by ``TaskSpec.architecture`` (the reader of ``relmem train squad``):
    ``build(model_name, model_config, head_config, spec) -> model``, the core chosen by
    ``--model`` inside it. The model is called as ``model(inputs, state, lengths) -> (logits,
    state)``, as every model the trainer builds.

    ``reads``: for a core the architecture builds in its own way, the fields of the core's
    section it reads and why no more (``{'dnc': (('memory_size', ...), 'one write head')}``);
    ``relmem train`` refuses the others (:func:`architecture_reads`). A core not named is read
    whole."""

    def decorator(build: ArchitectureBuilder) -> ArchitectureBuilder:
        if name in _ARCHITECTURES:
            raise ValueError(f"architecture {name!r} is already registered")
        _ARCHITECTURES[name] = build
        _ARCHITECTURE_READS[name] = dict(reads or {})
        return build

    return decorator


def architecture_reads(name: str, core: str) -> tuple[tuple[str, ...], str] | None:
    """``(fields, why)``: what the architecture ``name`` reads of the core ``core``'s section,
    when it reads only part of it (:func:`register_architecture`); None when it reads it
    whole."""
    return _ARCHITECTURE_READS.get(name, {}).get(core)


def get_architecture(name: str) -> ArchitectureBuilder:
    """The registered architecture ``name``; a ``KeyError`` listing the known ones otherwise."""
    if name not in _ARCHITECTURES:
        known = ", ".join(sorted(_ARCHITECTURES))
        raise KeyError(f"unknown architecture {name!r}; known architectures: {known}")
    return _ARCHITECTURES[name]
