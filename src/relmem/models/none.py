"""No memory at all (``--model none``): the reader's ablation, MemoReader without its memory
controller (``relmem train squad --model none``, ``docs/reading.md`` §3).

It is registered for the reader's architecture only (``architecture_only``): an ``encoder ->
core -> head`` model refuses it, since without a core nothing carries a sequence's past.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from relmem.cores.base import zero_padding
from relmem.models.registry import register_model


@dataclass
class NoneModelConfig:
    """No settings: the identity core has no parameters."""


class IdentityCore(nn.Module):
    """``inputs [B, T, F] -> outputs [B, T, F]`` unchanged (zero at padded steps); the state is
    an empty ``[B, 0]`` tensor."""

    def __init__(self, input_size: int) -> None:
        super().__init__()
        self.output_size = input_size

    def initial_state(self, batch_size: int, *, device=None) -> Tensor:
        return torch.zeros(batch_size, 0, device=device)

    def forward(
        self, inputs: Tensor, state: Tensor | None = None, *, lengths: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        if state is None:
            state = self.initial_state(inputs.shape[0], device=inputs.device)
        if lengths is not None:
            lengths = lengths.to(inputs.device)
            inputs = zero_padding(inputs.transpose(0, 1), lengths).transpose(0, 1)
        return inputs, state


@register_model("none", NoneModelConfig, architecture_only=True)
def build_none(config: NoneModelConfig, input_size: int, readout_size: None) -> IdentityCore:
    return IdentityCore(input_size)
