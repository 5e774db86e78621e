"""The registered models: one builder per core, choosing the head from the task's output kind.

``build(model_config, head_config, task_spec)`` returns a module mapping ``inputs [B, T, F]``
(and optional ``lengths [B]``) to ``logits [B, C]`` for a last-step task (the core's last output
through the MLP head of ``head_config``) or ``logits [B, T, O]`` for a per-step task (a linear
readout at every step; ``head_config`` is not used).
"""

from __future__ import annotations

from torch import nn

from relmem.models.classifier import (
    HeadConfig,
    LSTMClassifier,
    LSTMModelConfig,
    RMCClassifier,
    RMCModelConfig,
)
from relmem.models.dnc import DNCClassifier, DNCModelConfig, DNCPerStep
from relmem.models.per_step import LSTMPerStep, RMCPerStep
from relmem.models.registry import register_model
from relmem.models.spec import TaskSpec


@register_model("rmc", RMCModelConfig)
def build_rmc(config: RMCModelConfig, head: HeadConfig, spec: TaskSpec) -> nn.Module:
    """The RMC classifier of spec 1.3, or the RMC with a per-step readout."""
    return RMCPerStep(config, spec) if spec.per_step else RMCClassifier(config, head, spec)


@register_model("lstm", LSTMModelConfig)
def build_lstm(config: LSTMModelConfig, head: HeadConfig, spec: TaskSpec) -> nn.Module:
    """The ``nn.LSTM`` baseline with the same head, or with a per-step readout."""
    return LSTMPerStep(config, spec) if spec.per_step else LSTMClassifier(config, head, spec)


@register_model("dnc", DNCModelConfig)
def build_dnc(config: DNCModelConfig, head: HeadConfig, spec: TaskSpec) -> nn.Module:
    """The DNC with the same head, or with its output layer as the per-step readout."""
    return DNCPerStep(config, spec) if spec.per_step else DNCClassifier(config, head, spec)
