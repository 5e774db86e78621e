"""What a model builder needs to know about a task: :class:`TaskSpec`.

It lives with the models (tasks import it from here, models never import tasks), so the
dependency runs one way: ``cores <- models <- tasks <- train``.

A model is ``encoder -> core -> head``; the task picks the encoder by ``encoding`` and the head
by ``output``, both names registered in :mod:`relmem.models.encoders` and
:mod:`relmem.models.heads`, and the run's config picks the core.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
            model's dropout and softmax: ``{'lm': LMOptions(...)}``).
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
