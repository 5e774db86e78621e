"""The ConvLSTM baseline (after Shi et al. 2015, without their peephole terms) as a trainer
core (``--model convlstm``).

The paper's BoxWorld baseline replaces the RMC by a ConvLSTM with 64 channels and 2×2 kernels
of stride 1 (``docs/rl.md`` §3). Its state is a pair of feature maps ``(h, c)``, each
``[B, C, H, W]``; each step convolves the input map concatenated with ``h`` into the four
gates (input, forget, cell, output, in that order) and updates ``c`` and ``h`` as an LSTM does
per cell:

    i, f, g, o = split(conv([x; h]))
    c' = σ(f) ∘ c + σ(i) ∘ tanh(g),    h' = σ(o) ∘ tanh(c')

with no forget-gate bias beyond the convolution's own (``docs/rl.md`` §3: a library choice;
Sonnet's ``Conv2DLSTM`` adds 1.0).

**The spatial shape is configuration** (``height``, ``width``), not inferred from the data: the
state's shape (and so the TorchRL primer that must exist before the first step) depends on it.
A step's input is the ``[H·W·F_c]`` vector of the map read row-major, channels last (cell
``(y, x)``'s ``F_c`` features at ``(y·W + x)·F_c``), which is how the RL agent's encoder lays
out one row per cell; the agent sets ``height`` and ``width`` to the observation's grid. The
defaults (1×1) make it a core every sequence task can train: a 1×1 map with ``F`` channels.

Output per step: ``h'`` flattened, ``[B, C·H·W]`` (channel-major, as ``h.flatten(1)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from relmem.cores.base import finish_sequence, prepare_sequence, run_cell_loop
from relmem.models.registry import register_model
from relmem.validation import check_at_least, check_device, check_ints


def same_padding(kernel_size: int) -> tuple[int, int, int, int]:
    """``F.pad``'s ``(left, right, top, bottom)`` for TensorFlow's 'same' padding at stride 1:
    ``k - 1`` cells in all, the extra one after (``k = 2``: 0 before, 1 after). PyTorch's
    ``padding='same'`` pads the same way but warns for even kernels."""
    before = (kernel_size - 1) // 2
    after = kernel_size - 1 - before
    return (before, after, before, after)


class ConvLSTMState(NamedTuple):
    """The ConvLSTM state: ``h`` and ``c``, each ``[B, C, H, W]``."""

    h: Tensor
    c: Tensor


@dataclass
class ConvLSTMModelConfig:
    """ConvLSTM settings.

    Attributes:
        channels: C, the state's channels (paper 64).
        kernel_size: the square kernel's side (paper 2), stride 1, 'same' padding (for an even
            kernel PyTorch pads one more cell after than before, as TensorFlow does).
        height: the feature map's rows; the RL agent sets it to the observation's.
        width: the feature map's columns; the RL agent sets it to the observation's.
    """

    channels: int = 64
    kernel_size: int = 2
    height: int = 1
    width: int = 1

    def __post_init__(self) -> None:
        check_at_least("convlstm.", self, channels=1, kernel_size=1, height=1, width=1)


class ConvLSTMCore(nn.Module):
    """A batch-first ConvLSTM with the core contract of :mod:`relmem.models.registry`.

    Args:
        input_size: F = H·W·F_c, the flattened input map (``F_c`` channels per cell).
        channels, kernel_size, height, width: as :class:`ConvLSTMModelConfig`.

    Shapes:
        - inputs: ``[B, T, F]``, each step a ``[H, W, F_c]`` map flattened; lengths optional.
        - state: :class:`ConvLSTMState`, ``h`` and ``c`` each ``[B, C, H, W]``; None: zeros.
        - outputs: ``[B, T, C·H·W]``, zeros after each example's last valid step.
    """

    def __init__(
        self, input_size: int, channels: int, kernel_size: int, height: int, width: int
    ) -> None:
        super().__init__()
        name = type(self).__name__
        check_ints(
            name,
            input_size=input_size,
            channels=channels,
            kernel_size=kernel_size,
            height=height,
            width=width,
        )
        cells = height * width
        if input_size % cells:
            raise ValueError(
                f"ConvLSTMCore: input_size ({input_size}) must be a multiple of height·width "
                f"({height}·{width} = {cells}): each step is a [height, width, channels] map"
            )
        self.input_channels = input_size // cells
        self.channels, self.height, self.width = channels, height, width
        self.padding = same_padding(kernel_size)
        self.gates = nn.Conv2d(self.input_channels + channels, 4 * channels, kernel_size)

    @property
    def output_size(self) -> int:
        """C·H·W."""
        return self.channels * self.height * self.width

    def initial_state(
        self, batch_size: int, *, device: torch.device | str | None = None
    ) -> ConvLSTMState:
        """Zeros ``(h, c)``, each ``[B, C, H, W]``."""
        weight = self.gates.weight
        shape = (batch_size, self.channels, self.height, self.width)
        owner = f"{type(self).__name__}.initial_state"
        device = check_device(device, owner=owner) or weight.device
        zeros = torch.zeros(shape, device=device, dtype=weight.dtype)
        return ConvLSTMState(zeros, zeros.clone())

    def step(self, x: Tensor, state: ConvLSTMState) -> tuple[Tensor, ConvLSTMState]:
        """One step: ``x [B, F]`` -> ``(h' flattened [B, C·H·W], (h', c'))``."""
        grid = x.reshape(x.shape[0], self.height, self.width, self.input_channels)
        stacked = torch.cat([grid.permute(0, 3, 1, 2), state.h], dim=1)  # [B, F_c + C, H, W]
        i, f, g, o = self.gates(F.pad(stacked, self.padding)).chunk(4, dim=1)
        c = torch.sigmoid(f) * state.c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        return h.flatten(1), ConvLSTMState(h, c)

    def forward(
        self,
        inputs: Tensor,
        state: ConvLSTMState | None = None,
        *,
        lengths: Tensor | None = None,
    ) -> tuple[Tensor, ConvLSTMState]:
        """``inputs [B, T, F]`` -> ``(outputs [B, T, C·H·W], (h, c))``."""
        seq = prepare_sequence(inputs, lengths, True, 3, type(self).__name__)
        if state is None:
            state = self.initial_state(seq.inputs.shape[1], device=inputs.device)
        state = ConvLSTMState(*state)
        outputs, final = run_cell_loop(self.step, seq.inputs, state, seq.lengths)
        return finish_sequence(outputs, seq, True), final


@register_model("convlstm", ConvLSTMModelConfig)
def build_convlstm(
    config: ConvLSTMModelConfig, input_size: int, readout_size: None
) -> ConvLSTMCore:
    """A :class:`ConvLSTMCore` of ``config``'s sizes over ``input_size`` features per step."""
    return ConvLSTMCore(
        input_size, config.channels, config.kernel_size, config.height, config.width
    )
