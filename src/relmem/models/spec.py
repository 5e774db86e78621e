"""What a model builder needs to know about a task: :class:`TaskSpec`.

It lives with the models (tasks import it from here, models never import tasks), so the
dependency runs one way: ``cores <- models <- tasks <- train``.

A model is ``encoder -> core -> head``; the task picks the encoder by ``encoding`` and the head
by ``output``, both names registered in :mod:`relmem.models.encoders` and
:mod:`relmem.models.heads`, and the run's config picks the core.
"""

from __future__ import annotations

from dataclasses import dataclass, field, is_dataclass
from typing import Any, TypeVar


@dataclass(frozen=True)
class DecoderSpec:
    """The decoder of a sequence-to-sequence task (Learning to Execute, ``docs/tasks.md`` §2.5).

    Attributes:
        steps: T_out, decoder steps (the padded target length).
        pad_index: the input token that pads programs; each input's true length is the number
            of other tokens.
        teacher_forcing: the decoder reads ``T_out`` given tokens (``inputs[:, seq_len:]``)
            instead of zeros.
        separate_core: the decoder is a second core of the same kind and size (default: the
            encoder's core runs on). The encoder's outputs are then unused: a core's output
            layer that only shapes outputs (the DNC's) gets no gradient.
    """

    steps: int
    pad_index: int
    teacher_forcing: bool = False
    separate_core: bool = False


@dataclass(frozen=True)
class TaskSpec:
    """The shapes and kinds a task asks of its models.

    Attributes:
        input_size: F, features per step for the 'features' encoding; the vocabulary size for
            'one_hot' and 'embedding' (inputs are then ``[B, T]`` int64 token ids).
        seq_len: T, time steps per sequence (the longest one for padded, variable-length tasks;
            one window for stateful streams).
        output_size: the head's width: C class logits for 'last', O logits per step for
            'per_step'.
        output: the head, a name registered in :mod:`relmem.models.heads`: 'last' (the core's
            output at each sequence's last valid step through an MLP, ``logits [B, C]``) or
            'per_step' (a linear readout at every step, ``logits [B, T, O]``).
        encoding: the input encoding, a name registered in :mod:`relmem.models.encoders`:
            'features' (float ``[B, T, F]`` used as they are), 'one_hot' or 'embedding'
            (int64 ids ``[B, T]``).
        embedding_size: the width of the 'embedding' encoding (None for the others).
        decoder: None for ``encoder -> core -> head`` over the inputs' steps; a
            :class:`DecoderSpec` for a sequence-to-sequence model that reads the inputs, then
            emits ``decoder.steps`` outputs (:mod:`relmem.models.seq2seq`).
        options: further settings for the task's encoder and head, by name (a language
            model's dropout and softmax: ``{'lm': LMOptions(...)}``); each a config dataclass
            registered with :func:`register_option`.
        architecture: None for ``encoder -> core -> head``; the name of a registered model
            shape that holds the chosen core itself (``'reader'``,
            :func:`relmem.models.registry.register_architecture`).
    """

    input_size: int
    seq_len: int
    output_size: int
    output: str = "last"
    encoding: str = "features"
    embedding_size: int | None = None
    decoder: DecoderSpec | None = None
    options: dict[str, Any] = field(default_factory=dict)
    architecture: str | None = None

    @property
    def per_step(self) -> bool:
        """True when the model emits one output per step (``logits [B, T, O]``)."""
        return self.output != "last"


_Option = TypeVar("_Option", bound=type)
_OPTIONS: dict[str, type] = {}


def register_option(cls: _Option) -> _Option:
    """Class decorator: ``cls``, a config dataclass, may be a :class:`TaskSpec` option.

    An exported model's ``config.json`` names each option's class by its name here,
    ``cls.__name__`` (:func:`option_name`), and is read back through this closed table only:
    a file never names a module to import. The ``module.Class`` names that exports written
    before the table named are read too.

    Raises:
        ValueError: ``cls`` is not a dataclass, or its name is taken.
    """
    if not (isinstance(cls, type) and is_dataclass(cls)):
        raise ValueError(f"an option must be a config dataclass, got {cls!r}")
    for name in (cls.__name__, f"{cls.__module__}.{cls.__qualname__}"):
        if _OPTIONS.get(name, cls) is not cls:
            raise ValueError(f"option name {name!r} is already registered")
        _OPTIONS[name] = cls
    return cls


def option_name(cls: type) -> str | None:
    """The name ``config.json`` records for the option class ``cls`` (None: not registered)."""
    return cls.__name__ if _OPTIONS.get(cls.__name__) is cls else None


def option_class(name: str) -> type | None:
    """The registered option class recorded as ``name`` (its name, or the ``module.Class``
    of older exports); None for any other name (nothing is imported)."""
    return _OPTIONS.get(name)


def option_names() -> list[str]:
    """The registered options' names, sorted."""
    return sorted({cls.__name__ for cls in _OPTIONS.values()})
