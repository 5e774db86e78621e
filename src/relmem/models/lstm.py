"""The ``nn.LSTM`` baseline as a trainer core (``--model lstm``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from relmem.models.registry import register_model
from relmem.validation import check_at_least, check_device

LSTMState = tuple[Tensor, Tensor]


@dataclass
class LSTMModelConfig:
    """``nn.LSTM`` baseline settings.

    Attributes:
        hidden_size: units per layer (the paper swept 64 to 4096).
        num_layers: stacked layers.
    """

    hidden_size: int = 512
    num_layers: int = 1

    def __post_init__(self) -> None:
        check_at_least("lstm.", self, hidden_size=1, num_layers=1)


class LSTMCore(nn.LSTM):
    """A batch-first ``nn.LSTM`` with the core contract of :mod:`relmem.models.registry`.

    It *is* the ``nn.LSTM`` (same parameters and names, so cuDNN still runs it); only the call
    changes: a batch-leading state and ``lengths``.

    Shapes:
        - inputs: ``[B, T, F]``; lengths: optional ``[B]`` int64 in ``0..T``.
        - state: ``(h, c)``, each ``[B, L, H]`` (batch-leading, unlike ``nn.LSTM``'s
          ``[L, B, H]``); None means zeros.
        - outputs: ``[B, T, H]`` of the top layer, zeros after each example's last valid step.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1) -> None:
        super().__init__(input_size, hidden_size, num_layers, batch_first=True)

    @property
    def output_size(self) -> int:
        """H, the top layer's width."""
        return self.hidden_size

    def initial_state(
        self, batch_size: int, *, device: torch.device | str | None = None
    ) -> LSTMState:
        """Zeros ``(h, c)``, each ``[B, L, H]``."""
        weight = self.weight_ih_l0
        shape = (batch_size, self.num_layers, self.hidden_size)
        owner = f"{type(self).__name__}.initial_state"
        device = check_device(device, owner=owner) or weight.device
        zeros = torch.zeros(shape, device=device, dtype=weight.dtype)
        return zeros, zeros.clone()

    def forward(  # type: ignore[override]
        self, inputs: Tensor, state: LSTMState | None = None, *, lengths: Tensor | None = None
    ) -> tuple[Tensor, LSTMState]:
        """``inputs [B, T, F]`` -> ``(outputs [B, T, H], (h, c) [B, L, H] each)``."""
        hx = None if state is None else tuple(s.transpose(0, 1).contiguous() for s in state)
        if lengths is None:
            outputs, (h, c) = super().forward(inputs, hx)
        else:
            # Packing needs every length >= 1: an empty example runs one step, whose output and
            # state are then replaced by zeros and its initial state.
            lengths = lengths.cpu()
            empty = lengths == 0  # [B]
            packed = pack_padded_sequence(inputs, lengths.clamp(min=1), True, enforce_sorted=False)
            packed_out, (h, c) = super().forward(packed, hx)  # h, c in the input's order
            outputs, _ = pad_packed_sequence(packed_out, True, total_length=inputs.shape[1])
            if empty.any():
                empty = empty.to(inputs.device)
                outputs = outputs.masked_fill(empty.view(-1, 1, 1), 0)
                h0, c0 = hx if hx is not None else (torch.zeros_like(h), torch.zeros_like(c))
                h = torch.where(empty.view(1, -1, 1), h0, h)
                c = torch.where(empty.view(1, -1, 1), c0, c)
        return outputs, (h.transpose(0, 1), c.transpose(0, 1))


@register_model("lstm", LSTMModelConfig)
def build_lstm(config: LSTMModelConfig, input_size: int, readout_size: None) -> LSTMCore:
    """An :class:`LSTMCore` of ``config``'s sizes."""
    return LSTMCore(input_size, config.hidden_size, config.num_layers)
