"""The Differentiable Neural Computer (Graves et al. 2016): cell and sequence module.

:class:`DNCCell` runs one step of ``docs/dnc.md`` §2: the controller reads
``[x_t ; r_{t−1}]``, its output drives :class:`~relmem.cores.dnc.memory.DNCMemory`, and the
output is ``W_y [h_t ; r_t] + b_y``. :class:`DNC` runs the cell over a sequence with the
``nn.LSTM`` conventions of :mod:`relmem.cores.base`.

Notation: B batch, T time, X ``input_size``, Y ``output_size``, Hc ``hidden_size``, L
``num_layers``, N ``memory_size``, W ``word_size``, R ``num_read_heads``, Wh
``num_write_heads``, K ``link_topk``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from typing import Any, NamedTuple, cast

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from relmem.cores.base import finish_sequence, prepare_sequence, run_cell_loop, run_recomputed
from relmem.cores.dnc import fused as F
from relmem.cores.dnc.addressing import EPSILON
from relmem.cores.dnc.controller import Controller, ControllerState
from relmem.cores.dnc.memory import (
    Compat,
    DNCMemory,
    DNCMemoryState,
    Implementation,
    LinkKind,
    check_memory_options,
)
from relmem.validation import (
    allocation_errors,
    check_bool,
    check_factory,
    check_float,
    check_int,
    check_ints,
)


class DNCState(NamedTuple):
    """The recurrent state of a DNC (``docs/dnc.md`` §1); every tensor is batch-leading.

    Attributes:
        memory: ``[B, N, W]``. usage: ``[B, N]``.
        link: ``[B, Wh, N, N]`` (``[B, Wh, N, K]`` values with ``link='sparse'``; None with
            ``link='none'``). precedence: ``[B, Wh, N]`` (None with ``link='none'``).
        read_weights: ``[B, R, N]``. write_weights: ``[B, Wh, N]``. read_vectors: ``[B, R, W]``.
        controller: one ``(h, c)`` pair per controller layer, ``[B, Hc]`` each (``h`` alone for
            a GRU controller).
        link_index: ``[B, Wh, N, K]`` int64 columns of the sparse link, else None.
    """

    memory: Tensor
    usage: Tensor
    link: Tensor | None
    precedence: Tensor | None
    read_weights: Tensor
    write_weights: Tensor
    read_vectors: Tensor
    controller: ControllerState
    link_index: Tensor | None = None

    @property
    def memory_state(self) -> DNCMemoryState:
        """The memory fields as a :class:`DNCMemoryState`."""
        return DNCMemoryState(
            self.memory,
            self.usage,
            self.link,
            self.precedence,
            self.read_weights,
            self.write_weights,
            self.read_vectors,
            self.link_index,
        )

    @classmethod
    def combine(cls, memory: DNCMemoryState, controller: ControllerState) -> DNCState:
        """Build a state from the memory fields and a controller state."""
        fields = memory._asdict()
        link_index = fields.pop("link_index")
        return cls(**fields, controller=controller, link_index=link_index)


def fused_recurrence_ok(memory: DNCMemory, x: Tensor, state: DNCState) -> bool:
    """Whether :func:`fused_recurrence` runs ``x`` and ``state``: the memory's step is fused
    (``implementation`` and its options allow it, on the CPU, built), outside autocast, with
    the input, the state and the parameters in one float32 or float64 dtype."""
    dtype = x.dtype
    if dtype not in (torch.float32, torch.float64) or torch.is_autocast_enabled("cpu"):
        return False
    if state.memory.dtype != dtype or memory.factory_defaults()[1] != dtype:
        return False
    return memory.runs_fused(x)


def sequence_weights(memory: DNCMemory, controller: Controller) -> list[Tensor]:
    """The weights :func:`relmem.cores.dnc.fused.sequence` takes, in its order: per controller
    layer ``weight_ih, weight_hh, bias_ih, bias_hh``, then the interface's weight and bias."""
    assert memory.interface is not None
    weights: list[Tensor] = []
    for cell in controller.cells:
        rnn = cast(nn.RNNCellBase, cell)
        weights += [rnn.weight_ih, rnn.weight_hh, rnn.bias_ih, rnn.bias_hh]
    return weights + [memory.interface.weight, memory.interface.bias]


def fused_recurrence(
    memory: DNCMemory,
    controller: Controller,
    x: Tensor,
    state: DNCState,
    lengths: Tensor | None,
) -> tuple[Tensor, Tensor, DNCState]:
    """``docs/dnc.md`` §2.1–§2.8 over ``x`` as one C++ operator (:func:`relmem.cores.dnc.fused.
    sequence`): per step ``χ_t = [x_t ; r_{t−1}]``, the controller, the interface and the
    memory, one autograd node for the whole loop.

    Args:
        memory: its interface linear and options. controller: its cells and clip.
        x: ``[T, B, X]``. state: the validated state. lengths: ``[B]`` or None.

    Returns:
        ``(hiddens [T, B, L·Hc], reads [T, B, R·W], final state)``; a finished example's
        state is carried and its hiddens and reads are zeros (``docs/dnc.md`` §17).
    """
    lstm = controller.kind == "lstm"
    flat: list[Tensor] = []
    for entry in state.controller:
        flat += list(entry) if lstm else [entry]
    weights = sequence_weights(memory, controller)
    fields = state.memory_state[:7]  # every field but the sparse link's columns
    hiddens, reads, final_controller, final_memory = F.sequence(
        x,
        lengths,
        flat,
        fields,
        weights,
        memory.operator_offsets,
        lstm=lstm,
        layers=controller.num_layers,
        forget_bias=controller.forget_bias,
        clip=controller.clip_value,
        deepmind=memory.compat == "deepmind",
        usage_write_grad=memory.usage_write_grad,
        dealloc_content=memory.dealloc_content,
        interface_clip=memory.interface_clip,
        eps=memory.eps,
    )
    if lstm:
        pairs = zip(final_controller[::2], final_controller[1::2], strict=True)
        controller_state: ControllerState = tuple((h, c) for h, c in pairs)
    else:
        controller_state = tuple(final_controller)
    new_memory = DNCMemoryState(*final_memory)
    return hiddens, reads, DNCState.combine(new_memory, controller_state)


def check_step_input(
    owner: str,
    input: Any,
    size: int,
    device: torch.device,
    dtype: torch.dtype,
    *,
    size_name: str = "input_size",
    sequence_shape: tuple[int, ...] | None = None,
) -> None:
    """Validate one step's input ``[B, size]``: type, shape, dtype (unless autocast), device.

    ``size_name`` is the constructor argument that set ``size``; ``sequence_shape``, when the
    step is the first of a sequence, is the sequence's shape as the caller passed it (the
    errors show it rather than one step's).
    """
    if not isinstance(input, Tensor):
        raise TypeError(f"{owner}: input must be a torch.Tensor, got {type(input).__name__}")
    if input.dim() != 2 or input.shape[1] != size:
        if sequence_shape is not None:
            raise ValueError(
                f"{owner}: expected {size_name}={size} features per step (the last axis), got "
                f"input of shape {sequence_shape}"
            )
        raise ValueError(
            f"{owner}: expected input [B, {size_name}={size}], got shape {tuple(input.shape)}"
        )
    if input.shape[0] == 0:
        raise ValueError(f"{owner}: the input has an empty batch axis: {tuple(input.shape)}")
    if not input.is_floating_point():
        raise TypeError(
            f"{owner}: input must be a floating-point tensor, got {input.dtype}; convert "
            "integer tokens with an embedding or one-hot first"
        )
    if input.dtype != dtype and not torch.is_autocast_enabled(device.type):
        raise TypeError(
            f"{owner}: input dtype {input.dtype} differs from the parameters' {dtype}; convert "
            f"the input with .to({dtype}) or the module with .to(dtype)"
        )
    if input.device != device:
        raise ValueError(
            f"{owner}: input is on {input.device} but the module is on {device}; move one of "
            "them with .to(device)"
        )


class DNCCell(nn.Module):
    """One step of a Differentiable Neural Computer (``docs/dnc.md`` §2).

    Args:
        input_size: X.
        hidden_size: Hc, the LSTM controller's hidden size.
        memory_size: N (default 16). word_size: W (default 16).
        num_read_heads: R (default 4). num_write_heads: Wh (default 1).
        output_size: Y, independent of X; None means Y = Hc.
        num_layers: L, the paper's deep LSTM controller (default 1). Each layer sees
            ``[χ_t ; h^{l−1}_t]`` and the interface reads ``[h^1_t ; … ; h^L_t]``.
        compat: 'paper' (default) or 'deepmind' (softplus strengths, modes ``[b, f, c]``,
            deepmind's interface field order, Sonnet's truncated-normal init of the interface
            and output linears, a constant +1 forget bias, ``clip_value=20``;
            ``docs/dnc.md`` §3.3). The forget bias is a constant added to the pre-activation,
            as Sonnet does, not a trainable bias initialised to 1. The interface is one linear
            layer over all fields, the same function class as deepmind's one linear per field
            (concatenate their weights in deepmind's field order to convert). The LSTM weights
            keep PyTorch's initialisation in both modes.
        clip_value: clip the controller output, its carried state and the output to ±value;
            0 disables it. None (default) means 0 with 'paper' and 20 with 'deepmind'.
        link, link_topk, usage_write_grad, dealloc_content, key_mask, link_sharpness,
            interface_clip, eps: memory options, see :class:`DNCMemory`.
        implementation: the memory step: 'auto' (default: the fused C++ step on the CPU where
            the options allow it), 'fused' or 'reference'; see :class:`DNCMemory`.
        device, dtype: factory arguments.

    Shapes:
        - input: ``[B, X]``.
        - state: :class:`DNCState`; None means :meth:`initial_state`.
        - output: ``[B, Y]``.
    """

    @allocation_errors
    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        memory_size: int = 16,
        word_size: int = 16,
        num_read_heads: int = 4,
        num_write_heads: int = 1,
        *,
        output_size: int | None = None,
        num_layers: int = 1,
        compat: Compat = "paper",
        clip_value: float | None = None,
        link: LinkKind = "dense",
        link_topk: int = 8,
        usage_write_grad: bool = False,
        dealloc_content: bool = False,
        key_mask: bool = False,
        link_sharpness: bool = False,
        interface_clip: float = 0.0,
        eps: float = EPSILON,
        implementation: Implementation = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        check_ints(name, input_size=input_size, hidden_size=hidden_size, num_layers=num_layers)
        check_int("output_size", output_size, owner=name, optional=True)
        memory_options: dict[str, Any] = {
            "memory_size": memory_size,
            "word_size": word_size,
            "num_read_heads": num_read_heads,
            "num_write_heads": num_write_heads,
            "compat": compat,
            "link": link,
            "link_topk": link_topk,
            "usage_write_grad": usage_write_grad,
            "dealloc_content": dealloc_content,
            "key_mask": key_mask,
            "link_sharpness": link_sharpness,
            "interface_clip": interface_clip,
            "eps": eps,
            "implementation": implementation,
        }
        check_memory_options(name, memory_options)
        if clip_value is None:
            clip_value = 20.0 if compat == "deepmind" else 0.0
        check_float("clip_value", clip_value, minimum=0, owner=name, note=" (0 disables it)")
        factory = check_factory(device, dtype, owner=name)
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.output_size = hidden_size if output_size is None else output_size
        self.compat: Compat = compat
        self.clip_value = float(clip_value)
        self.memory = DNCMemory(hidden_size * num_layers, **memory_options, **factory)
        self.controller = Controller(
            input_size + self.memory.read_size,
            hidden_size,
            num_layers,
            "lstm",
            forget_bias=1.0 if compat == "deepmind" else 0.0,
            clip_value=self.clip_value,
            **factory,
        )
        self.output = nn.Linear(
            self.controller.output_size + self.memory.read_size, self.output_size, **factory
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyTorch's inits ('paper'); Sonnet's truncated-normal linears ('deepmind')."""
        self.controller.reset_parameters()
        self.memory.reset_parameters()
        if self.compat == "deepmind":
            std = 1.0 / math.sqrt(self.output.in_features)
            nn.init.trunc_normal_(self.output.weight, std=std, a=-2 * std, b=2 * std)
            nn.init.zeros_(self.output.bias)
        else:
            self.output.reset_parameters()

    def extra_repr(self) -> str:
        return (
            f"input_size={self.input_size}, hidden_size={self.hidden_size}, "
            f"output_size={self.output_size}, clip_value={self.clip_value}"
        )

    def factory_defaults(self) -> tuple[torch.device, torch.dtype]:
        return self.output.weight.device, self.output.weight.dtype

    def initial_state(
        self,
        batch_size: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> DNCState:
        """The all-zero state of ``docs/dnc.md`` §1 (deterministic; h and c are separate tensors).

        Args:
            batch_size: B.
            device, dtype: default to the module's parameters'.
        """
        memory = self.memory.initial_state(batch_size, device=device, dtype=dtype)
        controller = self.controller.initial_state(
            batch_size, device=memory.memory.device, dtype=memory.memory.dtype
        )
        return DNCState.combine(memory, controller)

    def check_state(self, state: Any, batch_size: int) -> DNCState:
        """Validate a user-given :class:`DNCState`; errors name the field and shapes."""
        name = type(self).__name__
        if not isinstance(state, DNCState):
            raise TypeError(
                f"{name}: state must be a DNCState (from initial_state or a previous call), got "
                f"{type(state).__name__}"
            )
        memory = self.memory.check_state(state.memory_state, batch_size, owner=name)
        device, dtype = self.factory_defaults()
        controller = self.controller.check_state(state.controller, batch_size, name, device, dtype)
        return DNCState.combine(memory, controller)

    def check_input(self, input: Any) -> None:
        """Validate one step's input ``[B, X]``."""
        device, dtype = self.factory_defaults()
        check_step_input(type(self).__name__, input, self.input_size, device, dtype)

    def step(self, input: Tensor, state: DNCState) -> tuple[Tensor, DNCState]:
        """One step on a validated input ``[B, X]`` and state: ``docs/dnc.md`` §2.1–§2.9 (the
        fused sequence of one where it runs, see :meth:`run`)."""
        if fused_recurrence_ok(self.memory, input, state):
            outputs, state = self.run(input.unsqueeze(0), state, None)
            return outputs[0], state
        return self.reference_step(input, state)

    def run(
        self, inputs: Tensor, state: DNCState, lengths: Tensor | None
    ) -> tuple[Tensor, DNCState]:
        """The fused recurrence over ``inputs [T, B, X]`` (:func:`fused_recurrence`), then the
        output ``W_y [h_t ; r_t] + b_y`` of every step in one product.

        Returns:
            ``(outputs [T, B, Y], final state)``; steps past ``lengths`` output zero.
        """
        hiddens, reads, state = fused_recurrence(
            self.memory, self.controller, inputs, state, lengths
        )
        output = self.output(torch.cat([hiddens, reads], dim=-1))  # [T, B, Y]
        if self.clip_value > 0:
            output = output.clamp(-self.clip_value, self.clip_value)
        if lengths is not None:
            steps = torch.arange(inputs.shape[0], device=inputs.device).unsqueeze(1)
            output = torch.where((steps < lengths).unsqueeze(-1), output, output.new_zeros(()))
        return output, state

    def reference_step(self, input: Tensor, state: DNCState) -> tuple[Tensor, DNCState]:
        """One step in eager ops (its memory step fused or not, as ``implementation`` says)."""
        reads = state.read_vectors.flatten(1)  # [B, R·W], r_{t−1}
        chi = torch.cat([input, reads.to(input.dtype)], dim=-1)  # [B, X + R·W]
        hidden, controller = self.controller(chi, state.controller)  # [B, L·Hc]
        assert self.memory.interface is not None
        interface = self.memory.interface(hidden)  # [B, interface_size]
        memory = self.memory.step(interface, state.memory_state)
        new_reads = memory.read_vectors.flatten(1)  # [B, R·W], r_t
        output = self.output(torch.cat([hidden, new_reads.to(hidden.dtype)], dim=-1))  # [B, Y]
        if self.clip_value > 0:
            output = output.clamp(-self.clip_value, self.clip_value)
        return output, DNCState.combine(memory, controller)

    def forward(self, input: Tensor, state: DNCState | None = None) -> tuple[Tensor, DNCState]:
        """Run one time step.

        Args:
            input: ``[B, X]``.
            state: :class:`DNCState`; None means :meth:`initial_state` on the module's device.

        Returns:
            ``(output [B, Y], new_state)``. The state is not detached.
        """
        self.check_input(input)
        batch = input.shape[0]
        state = self.initial_state(batch) if state is None else self.check_state(state, batch)
        return self.step(input, state)


def _with_sequence_options(cell: inspect.Signature) -> inspect.Signature:
    """:class:`DNCCell`'s constructor signature with ``batch_first`` after its positional
    arguments and ``recompute_steps`` after its keyword-only ones: the sequence module takes
    the cell's arguments, written once, and those two."""
    params = list(cell.parameters.values())
    at = next(i for i, p in enumerate(params) if p.kind is inspect.Parameter.KEYWORD_ONLY)
    batch_first = inspect.Parameter(
        "batch_first", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=False, annotation="bool"
    )
    recompute_steps = inspect.Parameter(
        "recompute_steps", inspect.Parameter.KEYWORD_ONLY, default=None, annotation="int | None"
    )
    return cell.replace(parameters=[*params[:at], batch_first, *params[at:], recompute_steps])


class DNC(nn.Module):
    """A Differentiable Neural Computer over a sequence, shaped like ``nn.LSTM``.

    It runs :class:`DNCCell` (available as ``.cell``) at every step; see it for the arguments.

    Args:
        input_size, hidden_size, memory_size, word_size, num_read_heads, num_write_heads:
            as :class:`DNCCell` (defaults N = 16, W = 16, R = 4, Wh = 1).
        batch_first: input and output are ``[B, T, ·]`` instead of ``[T, B, ·]`` (default
            False, as ``nn.LSTM``). The state is batch-leading either way.
        output_size, num_layers, compat, clip_value, link, link_topk, usage_write_grad,
            dealloc_content, key_mask, link_sharpness, interface_clip, eps, implementation,
            device, dtype: as :class:`DNCCell`.
        recompute_steps: None (default) keeps every step's intermediates for the backward; an
            integer runs the sequence in chunks of that many steps under activation
            checkpointing, so training keeps one chunk's (the dense link's ``B·Wh·N²`` per
            step most) and recomputes each chunk in the backward: about one more forward
            pass, the same outputs and gradients. For long sequences with a large N
            (``docs/dnc.md`` §17).

    Shapes:
        - input: ``[T, B, X]`` (``[B, T, X]`` with ``batch_first``) or a ``PackedSequence``.
        - lengths: optional ``[B]`` in ``0..T``; padded steps change no state and output zero.
        - output: ``[T, B, Y]`` (``[B, T, Y]`` with ``batch_first``), or a ``PackedSequence``.
        - state: :class:`DNCState` in and out (the state after each example's last step).
    """

    _signature = _with_sequence_options(inspect.signature(DNCCell.__init__))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        try:
            bound = self._signature.bind(self, *args, **kwargs)
        except TypeError as exc:  # name the class, as Python's own message does
            raise TypeError(f"{type(self).__name__}: {exc}") from None
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        del arguments["self"]
        self.batch_first = check_bool("batch_first", arguments.pop("batch_first"), owner="DNC")
        self.recompute_steps = check_int(
            "recompute_steps", arguments.pop("recompute_steps"), owner="DNC", optional=True
        )
        self.cell = DNCCell(**arguments)

    __init__.__signature__ = _signature  # type: ignore[attr-defined]

    @property
    def input_size(self) -> int:
        return self.cell.input_size

    @property
    def hidden_size(self) -> int:
        return self.cell.hidden_size

    @property
    def output_size(self) -> int:
        return self.cell.output_size

    def reset_parameters(self) -> None:
        self.cell.reset_parameters()

    def extra_repr(self) -> str:
        return f"batch_first={self.batch_first}, recompute_steps={self.recompute_steps}"

    def initial_state(
        self,
        batch_size: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> DNCState:
        """See :meth:`DNCCell.initial_state`."""
        return self.cell.initial_state(batch_size, device=device, dtype=dtype)

    def forward(
        self,
        input: Tensor | PackedSequence,
        state: DNCState | None = None,
        *,
        lengths: Tensor | Sequence[int] | None = None,
    ) -> tuple[Tensor | PackedSequence, DNCState]:
        """Run the DNC over a sequence.

        Args:
            input: ``[T, B, X]`` (batch-first if configured) or a ``PackedSequence``.
            state: initial :class:`DNCState`; None means :meth:`initial_state`.
            lengths: optional ``[B]`` valid lengths in ``0..T``.

        Returns:
            ``(output [T, B, Y], final_state)`` in the input's layout; never detached.
        """
        cell = self.cell
        seq = prepare_sequence(input, lengths, self.batch_first, 3, type(self).__name__)
        if seq.inputs.dim() != 3:
            raise ValueError(
                f"{type(self).__name__}: expected input of rank 3 ([T, B, X] or [B, T, X]), got "
                f"shape {tuple(seq.inputs.shape)} (time-major)"
            )
        shown = tuple(input.shape) if isinstance(input, Tensor) else tuple(seq.inputs.shape)
        device, dtype = cell.factory_defaults()
        check_step_input(
            type(self).__name__,
            seq.inputs[0],
            cell.input_size,
            device,
            dtype,
            sequence_shape=shown,
        )
        batch = seq.inputs.shape[1]
        state = cell.initial_state(batch) if state is None else cell.check_state(state, batch)
        fused = fused_recurrence_ok(cell.memory, seq.inputs, state)

        def run(
            inputs: Tensor, state: DNCState, lengths: Tensor | None
        ) -> tuple[tuple[Tensor], DNCState]:
            if fused:
                outputs, state = cell.run(inputs, state, lengths)
            else:
                outputs, state = run_cell_loop(cell.reference_step, inputs, state, lengths)
            return (outputs,), state

        (outputs,), final_state = run_recomputed(
            run, seq.inputs, state, seq.lengths, self.recompute_steps
        )
        return finish_sequence(outputs, seq, self.batch_first), final_state
