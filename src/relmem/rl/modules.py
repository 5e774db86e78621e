"""The agent's TensorDict modules: the cell encoder and the recurrent core plug-in
(``docs/rl.md`` §3).

- :class:`CellEncoder`: ``uint8 [*B, H, W, C]`` observations -> one row of 24 + 2 features per
  cell (two 2×2 convolutions with 'same' padding, ReLU, then x/y coordinate maps in [−1, 1]).
- :class:`RecurrentCoreModule`: any core of the model registry (:mod:`relmem.models.registry`)
  as a TorchRL recurrent module. It reads ``[input_key, *state_keys, "is_init"]`` and writes
  ``[output_key, *("next", state_key)]``; where ``is_init`` is true the incoming state is
  replaced by the core's own initial state (the RMC's identity memory, not zeros). Two modes,
  as TorchRL's ``LSTMModule``:

  * **sequential** (collection): the entries are ``[*B, ...]``, one step is taken;
  * **recurrent** (losses): the entries are ``[*B, T, ...]``; the state at ``t = 0`` is read
    from the data, the module steps through ``T`` and resets the rows whose ``is_init`` is
    true at any ``t`` (several trajectories may be packed along ``T``). Outputs are
    ``[*B, T, O]`` and the per-step new states ``[*B, T, *state]``.

  The mode is ``torchrl.modules.recurrent_mode()`` when a ``set_recurrent_mode`` context is
  active, otherwise ``default_recurrent_mode``. :meth:`~RecurrentCoreModule.make_tensordict_primer`
  declares the state to the environment (zeros; safe because the first step of every episode
  has ``is_init`` set). A missing state entry is an error, not zeros: a policy run without its
  primer would otherwise silently lose its memory (pytorch/rl issue 2362).
  On collected data, sequential mode over ``[B, T]`` entries computes every step from the
  state stored with it (no gradient through time). Note that TorchRL's value estimators
  (``GAE``, ``VTrace``, unshifted) mark ``("next", "is_init")`` wherever ``is_init`` is set
  before calling the value network on ``td["next"]``, so there the next value is computed from
  the initial state rather than from ``("next", state)``.
- :class:`RMCModule` and :class:`ConvLSTMModule`: the module over the RMC (matrix input, state
  key ``memory`` ``[N, M]``) and over the ConvLSTM (state keys ``h``, ``c`` ``[C, H, W]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import Tensor, nn
from torchrl.data import Unbounded
from torchrl.envs import TensorDictPrimer
from torchrl.modules import recurrent_mode

from relmem.cores.rmc import RelationalMemory, RMCConfig
from relmem.models.convlstm import ConvLSTMCore, same_padding
from relmem.rl import keys

__all__ = ["CellEncoder", "ConvLSTMModule", "RMCModule", "RecurrentCoreModule"]


class CellEncoder(nn.Module):
    """Observations to one feature row per cell (``docs/rl.md`` §3).

    Args:
        in_channels: C of the observation.
        conv_channels: the two convolutions' widths (paper 12, 24).
        kernel_size: their square kernel (paper 2), stride 1, TensorFlow 'same' padding.
        flatten: return ``[*B, H·W·F]`` (the rows concatenated) instead of ``[*B, H·W, F]``.

    Shapes:
        observation ``uint8 [*B, H, W, C]`` (scaled by 1/255) -> ``[*B, H·W, F]`` with
        F = ``conv_channels[-1] + 2``; a row is cell ``(y, x)``'s features, its last two the
        cell's x and y, evenly spaced in [−1, 1]. Rows are in row-major order (``y·W + x``).
    """

    def __init__(
        self,
        in_channels: int,
        conv_channels: Sequence[int] = (12, 24),
        kernel_size: int = 2,
        *,
        flatten: bool = False,
    ) -> None:
        super().__init__()
        widths = [in_channels, *conv_channels]
        self.convs = nn.ModuleList(
            nn.Conv2d(a, b, kernel_size) for a, b in zip(widths, widths[1:], strict=False)
        )
        self.padding = same_padding(kernel_size)
        self.flatten = flatten
        self.output_size = widths[-1] + 2  # per cell

    def forward(self, observation: Tensor) -> Tensor:
        *batch, height, width, channels = observation.shape
        x = observation.reshape(-1, height, width, channels).permute(0, 3, 1, 2)
        x = x.to(self.convs[0].weight.dtype) / 255.0
        for conv in self.convs:
            x = F.relu(conv(F.pad(x, self.padding)))
        ys = torch.linspace(-1.0, 1.0, height, device=x.device, dtype=x.dtype)
        xs = torch.linspace(-1.0, 1.0, width, device=x.device, dtype=x.dtype)
        grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")  # [H, W] each
        coords = torch.stack([grid_x, grid_y]).expand(x.shape[0], 2, height, width)
        rows = torch.cat([x, coords], dim=1).permute(0, 2, 3, 1)  # [B', H, W, F]
        rows = rows.reshape(*batch, height * width, self.output_size)
        return rows.flatten(-2) if self.flatten else rows


class RecurrentCoreModule(TensorDictModuleBase):
    """A registry core (:mod:`relmem.models.registry`) as a TorchRL recurrent module.

    Args:
        core: ``core(inputs [B, T, *in], state) -> (outputs [B, T, O], state)`` and
            ``core.initial_state(B, device=...)``, a tensor or a (named) tuple of tensors and
            None, each batch-leading.
        input_key, output_key: where the per-step input ``[*B, *in]`` is read and the output
            ``[*B, O]`` written.
        state_keys: one key per tensor of the state, in the state's order (default: a named
            tuple's field names, else ``state_0``, ``state_1``, ...).
        default_recurrent_mode: the mode outside a ``set_recurrent_mode`` context.

    Attributes:
        state_keys: the state's keys; ``state_shapes``: each one's per-example shape.
    """

    def __init__(
        self,
        core: nn.Module,
        *,
        input_key: str,
        output_key: str,
        state_keys: Sequence[str] | None = None,
        default_recurrent_mode: bool = False,
    ) -> None:
        super().__init__()
        self.core = core
        leaves, self._spec = pytree.tree_flatten(core.initial_state(1))
        self._present = [i for i, leaf in enumerate(leaves) if leaf is not None]
        if state_keys is None:
            state = core.initial_state(1)
            fields = getattr(state, "_fields", None)
            names = fields if fields else [f"state_{i}" for i in range(len(leaves))]
            state_keys = [names[i] for i in self._present]
        if len(state_keys) != len(self._present):
            raise ValueError(
                f"RecurrentCoreModule: {len(state_keys)} state_keys for a state of "
                f"{len(self._present)} tensors"
            )
        self.state_keys = list(state_keys)
        self.state_shapes = [tuple(leaves[i].shape[1:]) for i in self._present]
        self.input_key, self.output_key = input_key, output_key
        self.in_keys = [input_key, *self.state_keys, keys.IS_INIT]
        self.out_keys = [output_key, *(("next", k) for k in self.state_keys)]
        self.default_recurrent_mode = default_recurrent_mode

    @property
    def recurrent_mode(self) -> bool:
        mode = recurrent_mode()
        return self.default_recurrent_mode if mode is None else bool(mode)

    def make_tensordict_primer(self) -> TensorDictPrimer:
        """The environment transform that adds the state entries (zeros) to every reset."""
        pairs = zip(self.state_keys, self.state_shapes, strict=True)
        return TensorDictPrimer({k: Unbounded(shape=s) for k, s in pairs}, expand_specs=True)

    def initial_state(self, batch_size: int, device: torch.device) -> list[Tensor]:
        """The core's initial state as the list of the state keys' tensors, ``[B, ...]``."""
        leaves = pytree.tree_leaves(
            self.core.initial_state(batch_size, device=device), is_leaf=lambda x: x is None
        )
        return [leaves[i] for i in self._present]

    def step(self, x: Tensor, state: list[Tensor], is_init: Tensor) -> tuple[Tensor, list[Tensor]]:
        """One step of the core: reset where ``is_init`` (``bool [B]``), then run.

        Args:
            x: ``[B, *in]``; state: the state keys' tensors ``[B, ...]``.

        Returns:
            ``(output [B, O], new state)``.
        """
        initial = self.initial_state(x.shape[0], x.device)
        state = [
            torch.where(is_init.view(-1, *([1] * (s.dim() - 1))), i.to(s.dtype), s)
            for s, i in zip(state, initial, strict=True)
        ]
        leaves: list[Any] = [None] * self._spec.num_leaves
        for position, tensor in zip(self._present, state, strict=True):
            leaves[position] = tensor
        output, new_state = self.core(x.unsqueeze(1), pytree.tree_unflatten(leaves, self._spec))
        new_leaves = pytree.tree_leaves(new_state, is_leaf=lambda v: v is None)
        return output[:, 0], [new_leaves[i] for i in self._present]

    def _get(self, tensordict: TensorDictBase, key: str) -> Tensor:
        value = tensordict.get(key, None)
        if value is None:
            what = "InitTracker" if key == keys.IS_INIT else "the agent's make_tensordict_primer()"
            raise KeyError(
                f"{type(self).__name__}: the input has no {key!r} entry; append {what} to the "
                "environment (relmem.rl.envs.torchrl_env.make_env(..., primers=...))"
            )
        return value

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        x = self._get(tensordict, self.input_key)
        is_init = self._get(tensordict, keys.IS_INIT)
        states = [self._get(tensordict, k) for k in self.state_keys]
        if not self.recurrent_mode:
            batch = tensordict.shape
            pairs = zip(states, self.state_shapes, strict=True)
            flat = [s.reshape(-1, *shape) for s, shape in pairs]
            output, new = self.step(
                x.reshape(-1, *x.shape[len(batch) :]), flat, is_init.reshape(-1)
            )
            tensordict.set(self.output_key, output.reshape(*batch, -1))
            for key, tensor, shape in zip(self.state_keys, new, self.state_shapes, strict=True):
                tensordict.set(("next", key), tensor.reshape(*batch, *shape))
            return tensordict
        if tensordict.ndim < 1:
            raise ValueError(
                f"{type(self).__name__}: recurrent mode needs a time dimension (the "
                f"tensordict's last batch dimension), got batch shape {tuple(tensordict.shape)}"
            )
        *batch, steps = tensordict.shape
        rows = x.reshape(-1, steps, *x.shape[len(batch) + 1 :])  # [B', T, *in]
        starts = is_init.reshape(-1, steps)  # [B', T]
        state = [
            s.reshape(-1, steps, *shape)[:, 0]
            for s, shape in zip(states, self.state_shapes, strict=True)
        ]
        outputs, per_step = [], []
        for t in range(steps):
            output, state = self.step(rows[:, t], state, starts[:, t])
            outputs.append(output)
            per_step.append(state)
        tensordict.set(self.output_key, torch.stack(outputs, 1).reshape(*batch, steps, -1))
        for index, (key, shape) in enumerate(zip(self.state_keys, self.state_shapes, strict=True)):
            stacked = torch.stack([s[index] for s in per_step], 1)
            tensordict.set(("next", key), stacked.reshape(*batch, steps, *shape))
        return tensordict


class RMCModule(RecurrentCoreModule):
    """The Relational Memory Core in matrix mode as a TorchRL recurrent module.

    Args:
        config: the RMC's hyper-parameters (:class:`relmem.cores.rmc.RMCConfig`;
            ``input_rows`` set for matrix input ``[*B, n, F]``).
        input_key, output_key, memory_key: the entries read and written; the output is the
            flattened new memory ``[*B, N·M]``, the state ``memory_key`` ``[*B, N, M]``.
        default_recurrent_mode: as :class:`RecurrentCoreModule`.
    """

    def __init__(
        self,
        config: RMCConfig,
        *,
        input_key: str = "embedding",
        output_key: str = "core_output",
        memory_key: str = "memory",
        default_recurrent_mode: bool = False,
    ) -> None:
        core = RelationalMemory.from_config(config, batch_first=True)
        super().__init__(
            core,
            input_key=input_key,
            output_key=output_key,
            state_keys=[memory_key],
            default_recurrent_mode=default_recurrent_mode,
        )


class ConvLSTMModule(RecurrentCoreModule):
    """The ConvLSTM baseline (:class:`relmem.models.convlstm.ConvLSTMCore`) as a TorchRL
    recurrent module: input ``[*B, H·W·F_c]`` (an ``[H, W, F_c]`` map, row-major, channels
    last), output ``[*B, C·H·W]``, state keys ``h`` and ``c``, each ``[*B, C, H, W]``.

    Args:
        input_size, channels, kernel_size, height, width: as :class:`ConvLSTMCore`.
        input_key, output_key, default_recurrent_mode: as :class:`RecurrentCoreModule`.
    """

    def __init__(
        self,
        input_size: int,
        channels: int = 64,
        kernel_size: int = 2,
        height: int = 5,
        width: int = 5,
        *,
        input_key: str = "embedding",
        output_key: str = "core_output",
        default_recurrent_mode: bool = False,
    ) -> None:
        core = ConvLSTMCore(input_size, channels, kernel_size, height, width)
        super().__init__(
            core,
            input_key=input_key,
            output_key=output_key,
            default_recurrent_mode=default_recurrent_mode,
        )
