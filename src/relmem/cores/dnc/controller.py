"""Recurrent controllers for the DNC and the memory controller layer (``docs/dnc.md`` §2.2, §12).

A controller is a stack of ``nn.LSTMCell`` (or ``nn.GRUCell``) layers run one step at a time.
Layer l receives ``[χ_t ; h^{l−1}_t]`` (the paper's deep LSTM; layer 1 receives ``χ_t``) and the
controller output is ``[h^1_t ; … ; h^L_t]``.

Notation: B batch, X the controller input size, Hc the hidden size, L the number of layers.
"""

from __future__ import annotations

from typing import Any, Literal, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from relmem.cores.base import check_state_tensor
from relmem.validation import check_factory, check_float, check_ints

ControllerKind = Literal["lstm", "gru"]
ControllerState = tuple[Any, ...]
"""One entry per layer: ``(h, c)`` with ``[B, Hc]`` each for an LSTM, ``h [B, Hc]`` for a GRU."""


def lstm_cell_step(
    cell: nn.LSTMCell, x: Tensor, h: Tensor, c: Tensor, forget_bias: float
) -> tuple[Tensor, Tensor]:
    """One ``nn.LSTMCell`` step with a constant added to the forget-gate pre-activation.

    With ``forget_bias == 0`` this is ``cell(x, (h, c))``. Otherwise it recomputes the cell with
    PyTorch's gate order ``[i, f, g, o]`` and ``σ(f + forget_bias)``, Sonnet's ``LSTM``.

    Args:
        cell: the layer's weights.
        x: ``[B, in]``. h, c: ``[B, Hc]``.
        forget_bias: the constant.

    Returns:
        ``(h, c)``, each ``[B, Hc]``.
    """
    if forget_bias == 0:
        return cell(x, (h, c))
    gates = F.linear(x, cell.weight_ih, cell.bias_ih) + F.linear(h, cell.weight_hh, cell.bias_hh)
    i, f, g, o = gates.chunk(4, dim=-1)
    c = torch.sigmoid(f + forget_bias) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


class Controller(nn.Module):
    """A stacked LSTM or GRU controller stepped one time step at a time.

    Args:
        input_size: X, the controller input size (for the DNC: input size + R·W).
        hidden_size: Hc.
        num_layers: L (default 1).
        kind: 'lstm' (default) or 'gru'.
        forget_bias: constant added to the LSTM forget-gate pre-activation (Sonnet: 1.0). It is
            a constant, not a trainable bias, exactly as in Sonnet's ``LSTM``.
        clip_value: clip the output and the carried state to ±value; 0 disables it.
        device, dtype: factory arguments.

    Shapes:
        - input: ``[B, X]``.
        - state: one ``(h, c)`` (LSTM) or ``h`` (GRU) per layer, ``[B, Hc]`` each.
        - output: ``[B, L·Hc]``.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        kind: ControllerKind = "lstm",
        *,
        forget_bias: float = 0.0,
        clip_value: float = 0.0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        check_ints(name, input_size=input_size, hidden_size=hidden_size, num_layers=num_layers)
        if kind not in ("lstm", "gru"):
            raise ValueError(f"{name}: kind must be 'lstm' or 'gru', got {kind!r}")
        forget_bias = check_float("forget_bias", forget_bias, owner=name)
        if kind == "gru" and forget_bias != 0:
            raise ValueError(f"{name}: forget_bias applies to an LSTM controller only")
        clip_value = check_float(
            "clip_value", clip_value, minimum=0, owner=name, note=" (0 disables it)"
        )
        check_factory(device, dtype, owner=name)
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.kind: ControllerKind = kind
        self.forget_bias = forget_bias
        self.clip_value = clip_value
        cell_type = nn.LSTMCell if kind == "lstm" else nn.GRUCell
        self.cells = nn.ModuleList(
            cell_type(
                input_size + (hidden_size if layer > 0 else 0),
                hidden_size,
                device=device,
                dtype=dtype,
            )
            for layer in range(num_layers)
        )

    @property
    def output_size(self) -> int:
        """L·Hc."""
        return self.num_layers * self.hidden_size

    def reset_parameters(self) -> None:
        """PyTorch's recurrent-cell initialisation, U(−1/√Hc, 1/√Hc)."""
        for cell in self.cells:
            cast(nn.RNNCellBase, cell).reset_parameters()

    def extra_repr(self) -> str:
        text = f"kind={self.kind!r}, forget_bias={self.forget_bias}"
        return text + (f", clip_value={self.clip_value}" if self.clip_value else "")

    def initial_state(
        self, batch_size: int, *, device: torch.device, dtype: torch.dtype
    ) -> ControllerState:
        """Zeros; h and c are separate tensors."""
        shape = (batch_size, self.hidden_size)
        if self.kind == "lstm":
            return tuple(
                (
                    torch.zeros(shape, device=device, dtype=dtype),
                    torch.zeros(shape, device=device, dtype=dtype),
                )
                for _ in range(self.num_layers)
            )
        return tuple(torch.zeros(shape, device=device, dtype=dtype) for _ in range(self.num_layers))

    def check_state(
        self, state: Any, batch_size: int, owner: str, device: torch.device, dtype: torch.dtype
    ) -> ControllerState:
        """Validate a controller state; errors name the layer and the expected shape."""
        layers = "one (h, c) pair" if self.kind == "lstm" else "one h tensor"
        if not isinstance(state, (tuple, list)) or len(state) != self.num_layers:
            raise ValueError(
                f"{owner}: state.controller must hold {layers} per layer "
                f"({self.num_layers} layers), got {type(state).__name__}"
                + (f" of length {len(state)}" if isinstance(state, (tuple, list)) else "")
            )
        shape = (batch_size, self.hidden_size)
        checked = []
        for layer, entry in enumerate(state):
            if self.kind == "lstm":
                if not isinstance(entry, (tuple, list)) or len(entry) != 2:
                    raise ValueError(
                        f"{owner}: state.controller[{layer}] must be an (h, c) pair for an LSTM "
                        f"controller, got {type(entry).__name__}"
                    )
                for part, tensor in zip("hc", entry, strict=True):
                    check_state_tensor(
                        owner, f"controller[{layer}].{part}", tensor, shape, dtype, device
                    )
                checked.append(tuple(entry))
            else:
                check_state_tensor(owner, f"controller[{layer}]", entry, shape, dtype, device)
                checked.append(entry)
        return tuple(checked)

    def _clip(self, x: Tensor) -> Tensor:
        return x.clamp(-self.clip_value, self.clip_value) if self.clip_value > 0 else x

    def forward(self, input: Tensor, state: ControllerState) -> tuple[Tensor, ControllerState]:
        """One step.

        Args:
            input: ``[B, X]`` χ_t.
            state: the previous controller state.

        Returns:
            ``(output [B, L·Hc], new_state)``; both clipped when ``clip_value > 0``.
        """
        outputs: list[Tensor] = []
        new_state: list[Any] = []
        below: Tensor | None = None
        for cell, layer_state in zip(self.cells, state, strict=True):
            x = input if below is None else torch.cat([input, below], dim=-1)
            if self.kind == "lstm":
                h_prev, c_prev = layer_state
                h, c = lstm_cell_step(cast(nn.LSTMCell, cell), x, h_prev, c_prev, self.forget_bias)
                h, c = self._clip(h), self._clip(c)
                new_state.append((h, c))
            else:
                h = self._clip(cell(x, layer_state))
                new_state.append(h)
            outputs.append(h)
            below = h
        output = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-1)
        return output, tuple(new_state)
