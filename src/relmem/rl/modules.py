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
    from the data and the rows whose ``is_init`` is true at any ``t`` are reset there
    (several trajectories may be packed along ``T``). Outputs are ``[*B, T, O]`` and the
    per-step new states ``[*B, T, *state]``. Three implementations (``recurrent_impl``):
    ``'segments'`` (default) cuts ``T`` at every time where some row starts an episode and
    runs the core's sequence call once per segment; ``'episodes'`` runs one sequence call
    over every row's episodes, padded to a batch of their own with their lengths (for cores
    whose ``lengths`` skip the padding, as the LSTM's packed sequences do); ``'steps'``, the
    reference, calls the core one step at a time. Outputs and gradients agree (tested).
    Per-step states: see :class:`RecurrentCoreModule`.

  The mode is ``torchrl.modules.recurrent_mode()`` when a ``set_recurrent_mode`` context is
  active, otherwise ``default_recurrent_mode``. :meth:`~RecurrentCoreModule.make_tensordict_primer`
  declares the state to the environment (zeros; safe because the first step of every episode
  has ``is_init`` set). A missing state entry is an error, not zeros: a policy run without its
  primer would otherwise silently lose its memory (pytorch/rl issue 2362).
  On collected data, sequential mode over ``[B, T]`` entries computes every step from the
  state stored with it (no gradient through time). The learners compute the values their
  estimators read themselves (:func:`relmem.rl.learners.write_values`).
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

from relmem.cores.rmc import Implementation, RelationalMemory, RMCConfig
from relmem.models.convlstm import ConvLSTMCore, same_padding
from relmem.rl import keys
from relmem.validation import check_choice, check_int, check_ints

__all__ = ["CellEncoder", "ConvLSTMModule", "RMCModule", "RecurrentCoreModule"]


class CellEncoder(nn.Module):
    """Observations to one feature row per cell (``docs/rl.md`` §3).

    Args:
        in_channels: C of the observation.
        conv_channels: the two convolutions' widths (paper 12, 24).
        kernel_size: their square kernel (paper 2), stride 1, TensorFlow 'same' padding.
        flatten: return ``[*B, H·W·F]`` (the rows concatenated) instead of ``[*B, H·W, F]``.
        grid: ``(H, W)`` the observations must have (None: any; the agent's core fixes it).

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
        grid: tuple[int, int] | None = None,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        check_ints(name, in_channels=in_channels, kernel_size=kernel_size)
        if isinstance(conv_channels, (int, str)) or not conv_channels:
            raise ValueError(
                f"{name}: conv_channels must be a sequence of one or more widths, got "
                f"{conv_channels!r}"
            )
        for width in conv_channels:
            check_int("conv_channels", width, owner=name)
        self.grid = None if grid is None else tuple(grid)
        widths = [in_channels, *conv_channels]
        self.convs = nn.ModuleList(
            nn.Conv2d(a, b, kernel_size) for a, b in zip(widths, widths[1:], strict=False)
        )
        self.padding = same_padding(kernel_size)
        self.flatten = flatten
        self.output_size = widths[-1] + 2  # per cell

    def forward(self, observation: Tensor) -> Tensor:
        name = type(self).__name__
        if observation.dtype != torch.uint8:
            raise TypeError(
                f"{name}: observations must be uint8 (the encoder scales them by 1/255), got "
                f"{observation.dtype}"
            )
        expected = (*(self.grid or observation.shape[-3:-1]), self.convs[0].in_channels)
        if observation.dim() < 3 or tuple(observation.shape[-3:]) != expected:
            raise ValueError(
                f"{name}: observations must be [*B, {', '.join(map(str, expected))}] "
                f"(H, W, C), got {list(observation.shape)}"
            )
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
        recurrent_impl: ``'segments'`` (default): recurrent mode cuts ``T`` at the distinct
            times ``t > 0`` where any row has ``is_init`` and runs the core's sequence call
            over each segment, from the initial state for the rows that start an episode at
            the segment's first step and from the carried state for the others. With short
            episodes nearly every step is a cut, and a core whose sequence call is one fused
            op (the LSTM) loses it. ``'episodes'``: one sequence call over the S episodes
            (or parts of episodes) that the B rows hold, as a batch ``[S, L, *in]`` padded to
            the longest, L, with their ``lengths``; right for cores whose ``lengths`` skip
            the padding (the LSTM packs its sequences), wasteful for cores that step through
            it. ``'steps'``: the reference, one core call per step.

    With ``'segments'`` and ``'episodes'`` the per-step states ``("next", key)`` are exact at
    every step when :meth:`states_from_outputs` recovers them from the outputs (the RMC: its
    output is its memory). Otherwise a sequence call returns only its final state, so they are
    exact at the last step of every sequence call and zero at the other steps: with
    ``'segments'`` the step before any row's reset, with ``'episodes'`` the step before the
    row's own reset (as TorchRL's own ``LSTMModule`` writes them), and ``t = T - 1`` with
    both. TorchRL's losses and value estimators read the state at ``t = 0`` only
    (``docs/rl.md`` §3.2), :func:`relmem.rl.learners.write_values` the state after each
    episode's last step; ``'steps'`` writes every step's state for any core.

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
        recurrent_impl: str = "segments",
    ) -> None:
        super().__init__()
        self.recurrent_impl = check_choice(
            "recurrent_impl",
            recurrent_impl,
            ("segments", "episodes", "steps"),
            owner=type(self).__name__,
        )
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

    def _reset(self, state: list[Tensor], is_init: Tensor) -> list[Tensor]:
        """The state with the rows where ``is_init`` (``bool [B]``) replaced by the initial."""
        initial = self.initial_state(is_init.shape[0], state[0].device)
        return [
            torch.where(is_init.view(-1, *([1] * (s.dim() - 1))), i.to(s.dtype), s)
            for s, i in zip(state, initial, strict=True)
        ]

    def _run(
        self, x: Tensor, state: list[Tensor], lengths: Tensor | None = None
    ) -> tuple[Tensor, list[Tensor]]:
        """The core's sequence call: ``x [B, T, *in]`` (``lengths [B]``: the valid steps of
        each row, None: all) -> ``(outputs [B, T, O], the state after each row's last valid
        step)``."""
        leaves: list[Any] = [None] * self._spec.num_leaves
        for position, tensor in zip(self._present, state, strict=True):
            leaves[position] = tensor
        extra = {} if lengths is None else {"lengths": lengths}
        output, new_state = self.core(x, pytree.tree_unflatten(leaves, self._spec), **extra)
        new_leaves = pytree.tree_leaves(new_state, is_leaf=lambda v: v is None)
        return output, [new_leaves[i] for i in self._present]

    def step(self, x: Tensor, state: list[Tensor], is_init: Tensor) -> tuple[Tensor, list[Tensor]]:
        """One step of the core: reset where ``is_init`` (``bool [B]``), then run.

        Args:
            x: ``[B, *in]``; state: the state keys' tensors ``[B, ...]``.

        Returns:
            ``(output [B, O], new state)``.
        """
        output, new_state = self._run(x.unsqueeze(1), self._reset(state, is_init))
        return output[:, 0], new_state

    def states_from_outputs(self, outputs: Tensor) -> list[Tensor] | None:
        """The per-step states ``[B, T, *shape]`` of a sequence call, recovered from its
        outputs ``[B, T, O]``; None when the outputs do not determine them (the default)."""
        return None

    def run_steps(
        self, x: Tensor, state: list[Tensor], starts: Tensor
    ) -> tuple[Tensor, list[Tensor]]:
        """Recurrent mode, the reference: one :meth:`step` per time step.

        Args:
            x: ``[B, T, *in]``; state: the state at ``t = 0`` (before any reset), ``[B, ...]``;
            starts: ``bool [B, T]`` where an episode starts (``is_init``).

        Returns:
            ``(outputs [B, T, O], per-step new states [B, T, *shape])``.
        """
        outputs, per_step = [], []
        for t in range(x.shape[1]):
            output, state = self.step(x[:, t], state, starts[:, t])
            outputs.append(output)
            per_step.append(state)
        stacked = [torch.stack(s, 1) for s in zip(*per_step, strict=True)]
        return torch.stack(outputs, 1), stacked

    def run_segments(
        self, x: Tensor, state: list[Tensor], starts: Tensor
    ) -> tuple[Tensor, list[Tensor]]:
        """Recurrent mode over segments: one sequence call between consecutive reset times.

        Same arguments and returns as :meth:`run_steps`; the per-step states are exact where
        :class:`RecurrentCoreModule` says.
        """
        steps = x.shape[1]
        cuts = starts[:, 1:].any(0).nonzero().flatten().add(1).tolist()
        bounds = list(zip([0, *cuts], [*cuts, steps], strict=True))
        # split, not slicing: each slice's backward would zero-fill a [B, T, ...] gradient
        pieces = x.split([end - begin for begin, end in bounds], dim=1)
        outputs, per_step = [], []
        for (begin, end), piece in zip(bounds, pieces, strict=True):
            output, state = self._run(piece, self._reset(state, starts[:, begin]))
            outputs.append(output)
            recovered = self.states_from_outputs(output)
            if recovered is None:  # exact at the segment's last step only
                recovered = [
                    torch.cat(
                        [s.new_zeros(s.shape[0], end - begin - 1, *s.shape[1:]), s[:, None]], 1
                    )
                    for s in state
                ]
            per_step.append(recovered)
        if len(outputs) == 1:
            return outputs[0], per_step[0]
        stacked = [torch.cat(s, 1) for s in zip(*per_step, strict=True)]
        return torch.cat(outputs, 1), stacked

    def run_episodes(
        self, x: Tensor, state: list[Tensor], starts: Tensor
    ) -> tuple[Tensor, list[Tensor]]:
        """Recurrent mode over episodes: each row cut at its own resets, the S pieces padded
        into one batch ``[S, L, *in]`` and run in one sequence call with their lengths.

        Same arguments and returns as :meth:`run_steps`; the per-step states are exact where
        :class:`RecurrentCoreModule` says.
        """
        rows, steps = starts.shape
        opens = starts.clone()
        opens[:, 0] = True  # every row's first piece, whether or not an episode starts there
        flat = opens.flatten()  # [B·T]
        begins = flat.nonzero().flatten()  # [S]: where each piece starts, as a flat index
        ends = torch.cat([begins[1:], begins.new_tensor([rows * steps])])
        lengths = ends - begins  # [S]
        piece = flat.long().cumsum(0) - 1  # [B·T]: the piece of each step
        offset = torch.arange(rows * steps, device=x.device) - begins[piece]  # its step there
        shape = (len(begins), int(lengths.max()), *x.shape[2:])
        padded = x.new_zeros(shape).index_put((piece, offset), x.flatten(0, 1))
        # A row's first piece goes on from the stored state (reset if an episode starts at
        # t = 0); every other piece starts an episode.
        carried = self._reset(state, starts[:, 0])
        initial = self.initial_state(len(begins), x.device)
        first = begins % steps == 0  # [S]
        row = begins // steps
        piece_state = [
            torch.where(first.view(-1, *([1] * (c.dim() - 1))), c[row], i.to(c.dtype))
            for c, i in zip(carried, initial, strict=True)
        ]
        # Pieces that all fill the padded length (no row resets after t = 0) need no lengths
        full = int(lengths.min()) == shape[1]
        output, final = self._run(padded, piece_state, None if full else lengths)
        outputs = output[piece, offset].view(rows, steps, -1)
        recovered = self.states_from_outputs(outputs)
        if recovered is None:  # exact at each piece's last step only
            last = ends - 1
            recovered = [
                s.new_zeros(rows * steps, *s.shape[1:])
                .index_put((last,), s)
                .view(rows, steps, *s.shape[1:])
                for s in final
            ]
        return outputs, recovered

    def _get(self, tensordict: TensorDictBase, key: str) -> Tensor:
        value = tensordict.get(key, None)
        if value is None:
            what = "InitTracker" if key == keys.IS_INIT else "the agent's make_tensordict_primer()"
            raise KeyError(
                f"{type(self).__name__}: the input has no {key!r} entry; append {what} to the "
                "environment (relmem.rl.envs.torchrl_env.make_env(..., primers=...))"
            )
        return value

    def _state(self, tensordict: TensorDictBase, key: str, shape: tuple[int, ...]) -> Tensor:
        """The state entry ``key``, ``[*tensordict.shape, *shape]``.

        Raises:
            ValueError: another shape (a reshape would scramble it, or fail without naming it).
        """
        value = self._get(tensordict, key)
        if tuple(value.shape[tensordict.ndim :]) != tuple(shape):
            raise ValueError(
                f"{type(self).__name__}: state entry {key!r} must be "
                f"{[*tensordict.shape, *shape]} (batch, then {list(shape)}), got "
                f"{list(value.shape)}; the agent's make_tensordict_primer() makes it"
            )
        return value

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        x = self._get(tensordict, self.input_key)
        is_init = self._get(tensordict, keys.IS_INIT)
        pairs = zip(self.state_keys, self.state_shapes, strict=True)
        states = [self._state(tensordict, k, shape) for k, shape in pairs]
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
        run = {
            "segments": self.run_segments,
            "episodes": self.run_episodes,
            "steps": self.run_steps,
        }[self.recurrent_impl]
        outputs, per_step = run(rows, state, starts)
        tensordict.set(self.output_key, outputs.reshape(*batch, steps, -1))
        pairs = zip(self.state_keys, self.state_shapes, per_step, strict=True)
        for key, shape, stacked in pairs:
            tensordict.set(("next", key), stacked.reshape(*batch, steps, *shape))
        return tensordict


class RMCModule(RecurrentCoreModule):
    """The Relational Memory Core in matrix mode as a TorchRL recurrent module.

    Args:
        config: the RMC's hyper-parameters (:class:`relmem.cores.rmc.RMCConfig`;
            ``input_rows`` set for matrix input ``[*B, n, F]``).
        input_key, output_key, memory_key: the entries read and written; the output is the
            flattened new memory ``[*B, N·M]``, the state ``memory_key`` ``[*B, N, M]``.
        default_recurrent_mode, recurrent_impl: as :class:`RecurrentCoreModule`; with
            ``'segments'`` every per-step memory is exact: it is the step's output.
        implementation: the core's (:class:`relmem.cores.rmc.RelationalMemory`).
    """

    def __init__(
        self,
        config: RMCConfig,
        *,
        input_key: str = "embedding",
        output_key: str = "core_output",
        memory_key: str = "memory",
        default_recurrent_mode: bool = False,
        recurrent_impl: str = "segments",
        implementation: Implementation = "auto",
    ) -> None:
        core = RelationalMemory.from_config(config, batch_first=True, implementation=implementation)
        super().__init__(
            core,
            input_key=input_key,
            output_key=output_key,
            state_keys=[memory_key],
            default_recurrent_mode=default_recurrent_mode,
            recurrent_impl=recurrent_impl,
        )

    def states_from_outputs(self, outputs: Tensor) -> list[Tensor]:
        """The memory after each step, ``[B, T, N, M]``: without an output gate (the only
        configuration with one state key) the RMC's output is its new memory flattened."""
        return [outputs.unflatten(-1, self.state_shapes[0])]


class ConvLSTMModule(RecurrentCoreModule):
    """The ConvLSTM baseline (:class:`relmem.models.convlstm.ConvLSTMCore`) as a TorchRL
    recurrent module: input ``[*B, H·W·F_c]`` (an ``[H, W, F_c]`` map, row-major, channels
    last), output ``[*B, C·H·W]``, state keys ``h`` and ``c``, each ``[*B, C, H, W]``.

    Args:
        input_size, channels, kernel_size, height, width: as :class:`ConvLSTMCore`.
        input_key, output_key, default_recurrent_mode, recurrent_impl: as
            :class:`RecurrentCoreModule`.
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
        recurrent_impl: str = "segments",
    ) -> None:
        core = ConvLSTMCore(input_size, channels, kernel_size, height, width)
        super().__init__(
            core,
            input_key=input_key,
            output_key=output_key,
            default_recurrent_mode=default_recurrent_mode,
            recurrent_impl=recurrent_impl,
        )
