"""Output heads: how the core's per-step outputs become a task's logits.

A task names its head in :attr:`TaskSpec.output`; every head is called as
``head(outputs [B, T, H], lengths [B] | None) -> logits``. A head registered with
``linear=True`` is one linear map per step; on a core that ends in a linear layer of any
width (the DNC) it is folded into that layer instead of stacking a second one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from relmem.models.spec import TaskSpec

HeadBuilder = Callable[["HeadConfig", int, TaskSpec], nn.Module]


@dataclass
class HeadConfig:
    """The MLP head on the core's last output ('last' heads; per-step heads ignore it).

    Attributes:
        hidden_sizes: widths of the Linear + ReLU layers (paper: four of 256); the ReLU also
            follows the last of them, then a Linear to the class logits.
    """

    hidden_sizes: tuple[int, ...] = (256, 256, 256, 256)

    def __post_init__(self) -> None:
        self.hidden_sizes = tuple(self.hidden_sizes)
        if any(h < 1 for h in self.hidden_sizes):
            raise ValueError(f"head.hidden_sizes must be >= 1 each, got {self.hidden_sizes}")


@dataclass(frozen=True)
class HeadEntry:
    """A registered head: its builder, whether it is one linear map per step, and whether it
    reads the training config's ``head`` section (:class:`HeadConfig`: the MLPs do)."""

    name: str
    build: HeadBuilder
    linear: bool = False
    reads_config: bool = False


_HEADS: dict[str, HeadEntry] = {}


def register_head(
    name: str, *, linear: bool = False, reads_config: bool = False
) -> Callable[[HeadBuilder], HeadBuilder]:
    """Decorator registering ``build(head_config, core_output_size, spec) -> head``;
    ``reads_config``: the head is sized by ``head_config`` (``relmem train`` refuses
    ``--head.*`` for a task whose head is not)."""

    def decorator(build: HeadBuilder) -> HeadBuilder:
        if name in _HEADS:
            raise ValueError(f"head {name!r} is already registered")
        _HEADS[name] = HeadEntry(name, build, linear, reads_config)
        return build

    return decorator


def get_head(name: str) -> HeadEntry:
    """The registered head ``name``; a ``KeyError`` listing the known ones otherwise."""
    if name not in _HEADS:
        raise KeyError(f"unknown head {name!r}; known heads: {', '.join(sorted(_HEADS))}")
    return _HEADS[name]


def last_valid(outputs: Tensor, lengths: Tensor | None) -> Tensor:
    """Each sequence's output at its last valid step: ``[B, T, H] -> [B, H]``."""
    if lengths is None:
        return outputs[:, -1]
    rows = torch.arange(outputs.shape[0], device=outputs.device)
    return outputs[rows, lengths.to(outputs.device) - 1]


class LastStepMLP(nn.Sequential):
    """``[Linear + ReLU] * len(hidden_sizes)``, then ``Linear(C)``, on the last valid output.

    The paper's Nth Farthest head (``docs/tasks.md`` §1.3). For the RMC the last output is the
    final memory ``[B, N·M]``; for the LSTM the top layer's last hidden state.

    Shapes: ``outputs [B, T, H]``, ``lengths [B] | None`` -> ``logits [B, C]``.
    """

    def __init__(self, in_features: int, hidden_sizes: tuple[int, ...], num_classes: int) -> None:
        layers: list[nn.Module] = []
        width = in_features
        for hidden in hidden_sizes:
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, num_classes))
        super().__init__(*layers)

    def forward(self, outputs: Tensor, lengths: Tensor | None = None) -> Tensor:  # type: ignore[override]
        return super().forward(last_valid(outputs, lengths))


class PerStepLinear(nn.Linear):
    """``Linear(H, O)`` at every step: ``outputs [B, T, H] -> logits [B, T, O]``.

    Padded steps see a zero core output, so their logits are the bias (and are unscored).
    """

    def forward(self, outputs: Tensor, lengths: Tensor | None = None) -> Tensor:  # type: ignore[override]
        return super().forward(outputs)


class CoreReadout(nn.Module):
    """The core's own linear output layer already emits the logits (no parameters)."""

    def forward(self, outputs: Tensor, lengths: Tensor | None = None) -> Tensor:
        return outputs


@register_head("last", reads_config=True)
def build_last(config: HeadConfig, core_size: int, spec: TaskSpec) -> LastStepMLP:
    """:class:`LastStepMLP` to ``spec.output_size`` classes."""
    return LastStepMLP(core_size, config.hidden_sizes, spec.output_size)


@register_head("per_step", linear=True)
def build_per_step(config: HeadConfig, core_size: int, spec: TaskSpec) -> PerStepLinear:
    """:class:`PerStepLinear` to ``spec.output_size`` logits per step."""
    return PerStepLinear(core_size, spec.output_size)


class PerStepMLP(LastStepMLP):
    """:class:`LastStepMLP`'s layers at every step: ``outputs [B, T, H] -> logits [B, T, O]``.

    The paper's Learning to Execute head on each decoder step (``docs/tasks.md`` §2.5).
    """

    def forward(self, outputs: Tensor, lengths: Tensor | None = None) -> Tensor:
        return nn.Sequential.forward(self, outputs)


@register_head("per_step_mlp", reads_config=True)
def build_per_step_mlp(config: HeadConfig, core_size: int, spec: TaskSpec) -> PerStepMLP:
    """:class:`PerStepMLP` of ``config.hidden_sizes`` to ``spec.output_size`` logits per step."""
    return PerStepMLP(core_size, config.hidden_sizes, spec.output_size)
