"""Sequence classifiers: a recurrent core read to the end, then the paper's MLP head.

``specs/tasks.md`` 1.3: the model reads all T rows; the core's output after the last step goes
through 4 x (Linear(256) + ReLU) and a final Linear(C) giving logits. For the RMC that output is
the flattened memory ``[B, N·M]``; for the LSTM baseline the top layer's last hidden state. With
``lengths`` (right-padded batches) "the last step" is each sequence's last valid one.

This module also holds the RMC and LSTM configs and the head config, shared with the per-step
models of :mod:`relmem.models.per_step`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence

from relmem.cores.rmc import RelationalMemory
from relmem.models.spec import TaskSpec


@dataclass
class HeadConfig:
    """The MLP head on the core's last output.

    Attributes:
        hidden_sizes: widths of the Linear + ReLU layers (paper: four of 256); the ReLU also
            follows the last of them, then a Linear to the class logits.
    """

    hidden_sizes: tuple[int, ...] = (256, 256, 256, 256)

    def __post_init__(self) -> None:
        self.hidden_sizes = tuple(self.hidden_sizes)
        if any(h < 1 for h in self.hidden_sizes):
            raise ValueError(f"head.hidden_sizes must be positive, got {self.hidden_sizes}")


@dataclass
class RMCModelConfig:
    """RMC core settings (see :class:`relmem.cores.rmc.RelationalMemory`).

    Attributes:
        mem_slots: N, memory slots.
        head_size: D, value size per head.
        num_heads: H; the slot width is M = H·D.
        num_blocks: attention + MLP blocks per step.
        key_size: query/key size per head; None means D.
        attention_mlp_layers: L, depth of the row-wise MLP.
        gate_style: 'unit' (per element), 'memory' (per slot) or 'none'.
        forget_bias: constant added to the forget gate's pre-activation.
        input_bias: constant added to the input gate's pre-activation.
    """

    mem_slots: int = 8
    head_size: int = 32
    num_heads: int = 8
    num_blocks: int = 1
    key_size: int | None = None
    attention_mlp_layers: int = 2
    gate_style: Literal["unit", "memory", "none"] = "unit"
    forget_bias: float = 1.0
    input_bias: float = 0.0

    def __post_init__(self) -> None:
        for name in ("mem_slots", "head_size", "num_heads", "num_blocks", "attention_mlp_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"rmc.{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class LSTMModelConfig:
    """``nn.LSTM`` baseline settings.

    Attributes:
        hidden_size: units per layer (the paper swept 64 to 4096). num_layers: stacked layers.
    """

    hidden_size: int = 512
    num_layers: int = 1

    def __post_init__(self) -> None:
        if self.hidden_size < 1 or self.num_layers < 1:
            raise ValueError(
                f"lstm.hidden_size and lstm.num_layers must be >= 1, got "
                f"{self.hidden_size} and {self.num_layers}"
            )


def rmc_core(config: RMCModelConfig, input_size: int) -> RelationalMemory:
    """A batch-first :class:`RelationalMemory` from ``config``: ``[B, T, F] -> [B, T, N·M]``."""
    return RelationalMemory(
        input_size,
        config.mem_slots,
        config.head_size,
        config.num_heads,
        config.num_blocks,
        forget_bias=config.forget_bias,
        input_bias=config.input_bias,
        gate_style=None if config.gate_style == "none" else config.gate_style,
        attention_mlp_layers=config.attention_mlp_layers,
        key_size=config.key_size,
        batch_first=True,
    )


def mlp_head(in_features: int, config: HeadConfig, num_classes: int) -> nn.Sequential:
    """``[Linear + ReLU] * len(hidden_sizes)``, then ``Linear(num_classes)``.

    Shapes: ``[B, in_features] -> [B, num_classes]``.
    """
    layers: list[nn.Module] = []
    width = in_features
    for hidden in config.hidden_sizes:
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


class RMCClassifier(nn.Module):
    """RMC over the rows, flattened final memory, MLP head.

    Shapes:
        - input: ``[B, T, F]``; lengths: optional ``[B]`` int64 in ``1..T``.
        - output: logits ``[B, C]``.
    """

    def __init__(self, config: RMCModelConfig, head: HeadConfig, spec: TaskSpec) -> None:
        super().__init__()
        self.core = rmc_core(config, spec.input_size)
        self.head = mlp_head(self.core.output_size, head, spec.output_size)

    def forward(self, inputs: Tensor, lengths: Tensor | None = None) -> Tensor:
        """``inputs [B, T, F]`` -> ``logits [B, C]`` from the final memory ``[B, N·M]``.

        With ``lengths`` the final memory is each sequence's after its last valid step.
        """
        _, state = self.core(inputs, lengths=lengths)
        return self.head(state.memory.flatten(1))


class LSTMClassifier(nn.Module):
    """``nn.LSTM`` over the rows, last hidden state of the top layer, MLP head.

    Shapes:
        - input: ``[B, T, F]``; lengths: optional ``[B]`` int64 in ``1..T``.
        - output: logits ``[B, C]``.
    """

    def __init__(self, config: LSTMModelConfig, head: HeadConfig, spec: TaskSpec) -> None:
        super().__init__()
        self.core = nn.LSTM(
            spec.input_size, config.hidden_size, config.num_layers, batch_first=True
        )
        self.head = mlp_head(config.hidden_size, head, spec.output_size)

    def forward(self, inputs: Tensor, lengths: Tensor | None = None) -> Tensor:
        """``inputs [B, T, F]`` -> ``logits [B, C]`` from ``h_T`` of the top layer ``[B, H]``.

        With ``lengths`` the input is packed, so ``h`` is each sequence's at its last valid step.
        """
        if lengths is not None:
            packed = pack_padded_sequence(inputs, lengths.cpu(), True, enforce_sorted=False)
            _, (h, _) = self.core(packed)  # h: [num_layers, B, H], in the input's order
        else:
            _, (h, _) = self.core(inputs)
        return self.head(h[-1])


def count_parameters(module: nn.Module) -> int:
    """Number of trainable scalars in ``module``."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


__all__ = [
    "HeadConfig",
    "LSTMClassifier",
    "LSTMModelConfig",
    "RMCClassifier",
    "RMCModelConfig",
    "count_parameters",
    "mlp_head",
    "rmc_core",
]
