"""A sequence-to-sequence model around any registered core (``docs/tasks.md`` §2.5).

The paper's Learning to Execute set-up: the core reads the program from its initial state,
honouring each program's true length (its state is frozen after the last character); the
decoder starts from that state and runs ``T_out`` steps on all-zero inputs (not
autoregressive, no teacher forcing), and every decoder step's output goes through the head
(four Linear(256) + ReLU, then Linear(45)). Options: teacher forcing (the decoder reads given
tokens) and a separate decoder core of the same kind.

:func:`relmem.models.build_model` builds this model for a task whose :class:`TaskSpec` has a
``decoder``; the core is still ``--model``'s.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from relmem.models.spec import DecoderSpec


class Seq2SeqModel(nn.Module):
    """``encoder -> core`` over the input, then ``decoder core -> head`` for ``T_out`` steps.

    Args:
        encoder: token ids ``[B, T]`` -> features ``[B, T, F]`` (with ``output_size``).
        core: a registered core (the encoder's; also the decoder's unless ``decoder_core``).
        head: ``head(outputs [B, T_out, H], None) -> logits [B, T_out, O]``.
        input_steps: T_in, the padded input length (``TaskSpec.seq_len``).
        decoder: the decoder's settings.
        decoder_core: a separate decoder core, or None to share ``core``.

    Shapes:
        - inputs: ``[B, T_in]`` int64 (``[B, T_in + T_out]`` with teacher forcing: the
          program, then the decoder's input tokens).
        - lengths: ``[B]`` true input lengths; None derives them from the padding token.
        - returns ``(logits [B, T_out, O], the decoder's final state)``.
    """

    def __init__(
        self,
        encoder: nn.Module,
        core: nn.Module,
        head: nn.Module,
        input_steps: int,
        decoder: DecoderSpec,
        decoder_core: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.core = core
        self.decoder_core = decoder_core
        self.head = head
        self.input_steps = input_steps
        self.decoder = decoder

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> Any:
        """The encoder core's initial state for ``batch_size`` sequences."""
        return self.core.initial_state(batch_size, device=device)

    def forward(
        self, inputs: Tensor, state: Any = None, lengths: Tensor | None = None
    ) -> tuple[Tensor, Any]:
        program = inputs[:, : self.input_steps]  # [B, T_in]
        if lengths is None:
            lengths = (program != self.decoder.pad_index).sum(1)  # [B]
        # steps past every length change nothing; one step is kept for a batch of padding alone
        program = program[:, : max(1, int(lengths.max()))]
        encoded, state = self.core(self.encoder(program), state, lengths=lengths)
        batch, steps = inputs.shape[0], self.decoder.steps
        if self.decoder.teacher_forcing:
            given = self.encoder(inputs[:, self.input_steps :])  # [B, T_out, F]
        else:
            width = self.encoder.output_size
            given = torch.zeros(batch, steps, width, device=inputs.device)  # [B, T_out, F]
        decoder_core = self.core if self.decoder_core is None else self.decoder_core
        outputs, state = decoder_core(given, state)  # [B, T_out, H]
        if self.decoder_core is not None:
            # The encoder's outputs go unread (its state is handed on), and a core with an
            # output layer (the DNC's) would leave it without a gradient, which data-parallel
            # training waits for: a zero term keeps every parameter in the graph.
            outputs = outputs + encoded.flatten()[0] * 0.0
        return self.head(outputs, None), state
