"""Input encodings: how a task's inputs become the core's ``[B, T, F]`` features.

A task names its encoding in :attr:`TaskSpec.encoding`; each one here is a module with an
``output_size`` (the core's input width) built from the spec by a registered builder.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from relmem.models.spec import TaskSpec
from relmem.validation import check_int

EncoderBuilder = Callable[[TaskSpec], nn.Module]

_ENCODERS: dict[str, EncoderBuilder] = {}


def register_encoder(name: str) -> Callable[[EncoderBuilder], EncoderBuilder]:
    """Decorator registering ``build(spec) -> encoder`` under ``name``."""

    def decorator(build: EncoderBuilder) -> EncoderBuilder:
        if name in _ENCODERS:
            raise ValueError(f"encoding {name!r} is already registered")
        _ENCODERS[name] = build
        return build

    return decorator


def build_encoder(spec: TaskSpec) -> nn.Module:
    """The encoder ``spec.encoding`` names; a ``KeyError`` listing the known ones otherwise."""
    if spec.encoding not in _ENCODERS:
        known = ", ".join(sorted(_ENCODERS))
        raise KeyError(f"unknown encoding {spec.encoding!r}; known encodings: {known}")
    return _ENCODERS[spec.encoding](spec)


class Features(nn.Module):
    """Float features used as they are: ``[B, T, F] -> [B, T, F]`` (no parameters)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.output_size = check_int("input_size", size, owner="Features")

    def forward(self, inputs: Tensor) -> Tensor:
        return inputs


class OneHot(nn.Module):
    """Token ids as one-hot vectors: ``[B, T]`` int64 in ``0..V-1`` -> ``[B, T, V]`` float32."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.output_size = check_int("vocab_size", vocab_size, owner="OneHot")

    def forward(self, inputs: Tensor) -> Tensor:
        return F.one_hot(inputs, self.output_size).float()


class Embedding(nn.Embedding):
    """Token ids through a learned table: ``[B, T]`` int64 -> ``[B, T, E]``."""

    @property
    def output_size(self) -> int:
        """E, the embedding width."""
        return self.embedding_dim


@register_encoder("features")
def build_features(spec: TaskSpec) -> Features:
    """:class:`Features` of width ``spec.input_size``."""
    return Features(spec.input_size)


@register_encoder("one_hot")
def build_one_hot(spec: TaskSpec) -> OneHot:
    """:class:`OneHot` over a vocabulary of ``spec.input_size`` tokens."""
    return OneHot(spec.input_size)


@register_encoder("embedding")
def build_embedding(spec: TaskSpec) -> Embedding:
    """:class:`Embedding` of ``spec.input_size`` tokens into ``spec.embedding_size`` wide rows."""
    if spec.embedding_size is None:
        raise ValueError("the 'embedding' encoding needs TaskSpec.embedding_size")
    vocab = check_int("input_size", spec.input_size, owner="Embedding")
    return Embedding(vocab, check_int("embedding_size", spec.embedding_size, owner="Embedding"))
