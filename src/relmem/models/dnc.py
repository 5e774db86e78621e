"""The DNC for the trainer: its config, a classifier and a per-step model.

- Last-step tasks (Nth Farthest): the DNC's output ``y_t = W_y [h_t ; r_t] + b_y`` (width
  ``hidden_size``) at each sequence's last valid step goes through the same MLP head as the RMC
  and the LSTM (``specs/tasks.md`` 1.3).
- Per-step tasks (copy, repeat copy, associative recall): the DNC's output layer is the per-step
  linear readout, emitting the O target logits at every step, as ``deepmind/dnc``'s DNC does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from relmem.cores.dnc import DNC
from relmem.models.classifier import HeadConfig, mlp_head
from relmem.models.spec import TaskSpec


@dataclass
class DNCModelConfig:
    """DNC settings (see :class:`relmem.cores.dnc.DNC`); the defaults are ``deepmind/dnc``
    ``train.py``'s repeat-copy model (``specs/dnc.md`` section 14).

    Attributes:
        hidden_size: Hc, units per LSTM controller layer.
        num_layers: L, controller layers (the Nth Farthest paper's DNC baseline uses 2).
        memory_size: N, memory slots.
        word_size: W, the width of a slot.
        num_read_heads: R.
        num_write_heads: Wh.
        clip_value: clip the controller output and state and the DNC output to ±value; 0
            disables it (deepmind: 20).
        compat: 'paper' (Graves et al. 2016) or 'deepmind' (``deepmind/dnc``'s interface
            activations, initialisation and forget bias; ``specs/dnc.md`` 3.3).
    """

    hidden_size: int = 64
    num_layers: int = 1
    memory_size: int = 16
    word_size: int = 16
    num_read_heads: int = 4
    num_write_heads: int = 1
    clip_value: float = 20.0
    compat: Literal["paper", "deepmind"] = "paper"

    def __post_init__(self) -> None:
        sizes = ("hidden_size", "num_layers", "memory_size", "word_size")
        for name in (*sizes, "num_read_heads", "num_write_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"dnc.{name} must be >= 1, got {getattr(self, name)}")
        if not self.clip_value >= 0:
            raise ValueError(f"dnc.clip_value must be >= 0 (0 disables it), got {self.clip_value}")
        if self.compat not in ("paper", "deepmind"):
            raise ValueError(f"dnc.compat must be 'paper' or 'deepmind', got {self.compat!r}")


def dnc_core(config: DNCModelConfig, input_size: int, output_size: int | None) -> DNC:
    """A batch-first :class:`DNC`: ``[B, T, X] -> [B, T, Y]`` (Y = Hc when ``output_size`` is
    None)."""
    return DNC(
        input_size,
        config.hidden_size,
        config.memory_size,
        config.word_size,
        config.num_read_heads,
        config.num_write_heads,
        batch_first=True,
        output_size=output_size,
        num_layers=config.num_layers,
        compat=config.compat,
        clip_value=config.clip_value,
    )


class DNCClassifier(nn.Module):
    """DNC over the rows, its output at the last valid step, MLP head.

    Shapes:
        - input: ``[B, T, F]``; lengths: optional ``[B]`` int64 in ``1..T``.
        - output: logits ``[B, C]``.
    """

    def __init__(self, config: DNCModelConfig, head: HeadConfig, spec: TaskSpec) -> None:
        super().__init__()
        self.core = dnc_core(config, spec.input_size, None)
        self.head = mlp_head(self.core.output_size, head, spec.output_size)

    def forward(self, inputs: Tensor, lengths: Tensor | None = None) -> Tensor:
        """``inputs [B, T, F]`` -> ``logits [B, C]`` from ``y`` at each last valid step."""
        outputs, _ = self.core(inputs, lengths=lengths)  # [B, T, Hc]
        if lengths is None:
            last = outputs[:, -1]  # [B, Hc]
        else:
            rows = torch.arange(outputs.shape[0], device=outputs.device)
            last = outputs[rows, lengths.to(outputs.device) - 1]  # [B, Hc]
        return self.head(last)


class DNCPerStep(nn.Module):
    """DNC whose output layer emits the task's O logits at every step.

    Shapes:
        - input: ``[B, T, F]``; lengths: optional ``[B]`` int64 in ``1..T`` (padded steps
          change no state and output zeros).
        - output: logits ``[B, T, O]``, clipped to ±``clip_value`` when that is > 0.
    """

    def __init__(self, config: DNCModelConfig, spec: TaskSpec) -> None:
        super().__init__()
        self.core = dnc_core(config, spec.input_size, spec.output_size)

    def forward(self, inputs: Tensor, lengths: Tensor | None = None) -> Tensor:
        """``inputs [B, T, F]`` -> ``logits [B, T, O]``."""
        outputs, _ = self.core(inputs, lengths=lengths)
        return outputs
