"""Per-step models: a recurrent core and a Linear readout of its output at every step.

For per-step tasks (copy, repeat copy, associative recall; ``TaskSpec.output == 'per_step'``)
the model emits logits at every input step; the task's mask decides which steps are scored.
The RMC's per-step output is its flattened memory ``[B, T, N·M]``; the LSTM's the top layer's
hidden state ``[B, T, H]``. (The DNC's own output layer is its readout: see
:mod:`relmem.models.dnc`.)
"""

from __future__ import annotations

from torch import Tensor, nn

from relmem.models.classifier import LSTMModelConfig, RMCModelConfig, rmc_core
from relmem.models.spec import TaskSpec


class RMCPerStep(nn.Module):
    """RMC over the steps, ``Linear(N·M, O)`` on each step's output.

    Shapes:
        - input: ``[B, T, F]``; lengths: optional ``[B]`` int64 in ``1..T``.
        - output: logits ``[B, T, O]``. Padded steps (``t >= lengths[b]``) see a zero core
          output, so their logits are the readout's bias.
    """

    def __init__(self, config: RMCModelConfig, spec: TaskSpec) -> None:
        super().__init__()
        self.core = rmc_core(config, spec.input_size)
        self.readout = nn.Linear(self.core.output_size, spec.output_size)

    def forward(self, inputs: Tensor, lengths: Tensor | None = None) -> Tensor:
        """``inputs [B, T, F]`` -> ``logits [B, T, O]``."""
        outputs, _ = self.core(inputs, lengths=lengths)  # [B, T, N·M]
        return self.readout(outputs)


class LSTMPerStep(nn.Module):
    """``nn.LSTM`` over the steps, ``Linear(H, O)`` on the top layer's output at each step.

    Shapes:
        - input: ``[B, T, F]``; lengths: optional ``[B]``, accepted for the common model
          interface and not needed: the LSTM is causal, so the padding after a sequence cannot
          change its valid steps' outputs, and the padded steps themselves are unscored.
        - output: logits ``[B, T, O]``.
    """

    def __init__(self, config: LSTMModelConfig, spec: TaskSpec) -> None:
        super().__init__()
        self.core = nn.LSTM(
            spec.input_size, config.hidden_size, config.num_layers, batch_first=True
        )
        self.readout = nn.Linear(config.hidden_size, spec.output_size)

    def forward(self, inputs: Tensor, lengths: Tensor | None = None) -> Tensor:
        """``inputs [B, T, F]`` -> ``logits [B, T, O]``."""
        outputs, _ = self.core(inputs)  # [B, T, H]
        return self.readout(outputs)
