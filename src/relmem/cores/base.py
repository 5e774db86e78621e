"""Sequence plumbing shared by every recurrent core in relmem.

Every core is a *cell* (one time step, ``cell(input_t, state) -> (output_t, state)``) and a
*sequence module* that runs the cell over time with the ``nn.LSTM`` conventions:

- input ``[T, B, ...]``, or ``[B, T, ...]`` with ``batch_first=True``; the state is always
  batch-leading, whatever ``batch_first`` says;
- ``lengths`` (or a ``PackedSequence``) for padded batches: after example ``b``'s last step its
  state is carried unchanged and its output is zero, as in TF ``dynamic_rnn``;
- the values at padded steps are inert: :func:`prepare_sequence` replaces them with zeros by
  selection, so NaN or inf there changes no output and no gradient;
- the state is never detached inside ``forward``; :func:`detach_state` is for the caller.

The helpers here are deliberately small and free of model logic so that the reference loop
(:func:`run_cell_loop`) stays obviously correct: it is the oracle every fast path is tested
against.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

import torch
import torch.utils.checkpoint
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

StateT = TypeVar("StateT")


def map_state(fn: Callable[..., Tensor | None], *states: Any) -> Any:
    """Apply ``fn`` leaf-wise over one or more states of identical structure.

    A state is a ``Tensor``, ``None``, or a (named) tuple or list of states. ``fn`` receives the
    corresponding leaves of every state; ``None`` leaves are passed through unchanged.
    """
    first = states[0]
    if first is None:
        return None
    if isinstance(first, Tensor):
        return fn(*states)
    if isinstance(first, tuple) and hasattr(first, "_fields"):  # NamedTuple
        return type(first)(*(map_state(fn, *leaves) for leaves in zip(*states, strict=True)))
    if isinstance(first, (tuple, list)):
        return type(first)(map_state(fn, *leaves) for leaves in zip(*states, strict=True))
    raise TypeError(f"a state must be made of tensors, tuples and None; got {type(first).__name__}")


def detach_state(state: StateT) -> StateT:
    """Return ``state`` with every tensor detached from the autograd graph.

    Use it between windows of truncated back-propagation through time::

        output, state = rmc(window, state)
        loss.backward()
        state = relmem.detach_state(state)

    The modules never do this themselves.
    """
    return map_state(lambda t: t.detach(), state)


def where_active(active: Tensor, new: Any, old: Any) -> Any:
    """Per-example select between two states (or outputs) of identical structure.

    Args:
        active: ``[B]`` bool, True where the example is still inside its sequence.
        new: state after this step; every tensor is batch-leading ``[B, ...]``.
        old: state before this step, same structure.

    Returns:
        ``new`` where ``active`` else ``old``, leaf by leaf.
    """

    def select(n: Tensor, o: Tensor) -> Tensor:
        mask = active.view(-1, *([1] * (n.dim() - 1)))
        return torch.where(mask, n, o)

    return map_state(select, new, old)


class SequenceInput(NamedTuple):
    """A sequence input normalised to time-major form (see :func:`prepare_sequence`)."""

    inputs: Tensor
    """``[T, B, ...]`` time-major input."""
    lengths: Tensor | None
    """``[B]`` int64 on the input's device, or None when every sequence has length T."""
    packed: bool
    """Whether the caller passed a PackedSequence (the output is packed the same way)."""


def prepare_sequence(
    input: Tensor | PackedSequence,
    lengths: Tensor | Sequence[int] | None,
    batch_first: bool,
    min_rank: int,
    module_name: str,
) -> SequenceInput:
    """Validate a sequence input and bring it to time-major form.

    Args:
        input: ``[T, B, ...]`` (``[B, T, ...]`` if ``batch_first``) or a ``PackedSequence``.
        lengths: optional ``[B]`` valid lengths, each in ``0..T``.
        batch_first: as in ``nn.LSTM``.
        min_rank: the smallest acceptable rank of the padded input (3 for ``[T, B, F]``).
        module_name: used in error messages.
    """
    if isinstance(input, PackedSequence):
        if lengths is not None:
            raise ValueError(
                f"{module_name}: pass either a PackedSequence or `lengths`, not both "
                "(a PackedSequence already carries its lengths)"
            )
        padded, packed_lengths = pad_packed_sequence(input, batch_first=False)
        return SequenceInput(padded, packed_lengths.to(padded.device), True)
    if not isinstance(input, Tensor):
        raise TypeError(
            f"{module_name}: input must be a torch.Tensor or PackedSequence, "
            f"got {type(input).__name__}"
        )
    layout = "[B, T, ...]" if batch_first else "[T, B, ...]"
    if input.dim() < min_rank:
        raise ValueError(
            f"{module_name}: expected a sequence input of rank >= {min_rank} laid out as "
            f"{layout} (batch_first={batch_first}), got shape {tuple(input.shape)}"
        )
    inputs = input.transpose(0, 1) if batch_first else input
    steps, batch = inputs.shape[0], inputs.shape[1]
    if steps == 0 or batch == 0:
        raise ValueError(
            f"{module_name}: the input has an empty time or batch axis: shape {tuple(input.shape)}"
        )
    checked = check_lengths(lengths, batch, steps, input.device, module_name)
    return SequenceInput(zero_padding(inputs, checked), checked, False)


def zero_padding(inputs: Tensor, lengths: Tensor | None) -> Tensor:
    """``inputs [T, B, ...]`` with zeros at every padded step (``t >= lengths[b]``).

    A selection, not a product: NaN or inf at a padded step would survive ``x * 0`` and, through
    the weight gradients of every layer the padded step passes, poison training even where the
    padded outputs are discarded. After this, padded values can change no output and no gradient.
    """
    if lengths is None:
        return inputs
    steps = torch.arange(inputs.shape[0], device=inputs.device).unsqueeze(1)  # [T, 1]
    valid = (steps < lengths).view(steps.shape[0], -1, *([1] * (inputs.dim() - 2)))  # [T, B, 1..]
    return torch.where(valid, inputs, inputs.new_zeros(()))


def check_lengths(
    lengths: Tensor | Sequence[int] | None,
    batch: int,
    steps: int,
    device: torch.device,
    module_name: str,
) -> Tensor | None:
    """Validate ``lengths`` and return it as ``[B]`` int64 on ``device`` (or None)."""
    if lengths is None:
        return None
    try:
        lengths_t = torch.as_tensor(lengths)
    except (TypeError, ValueError, RuntimeError):  # a string, ragged lists, ...
        raise TypeError(
            f"{module_name}: lengths must be a [B] tensor or sequence of integers, got "
            f"{type(lengths).__name__}"
        ) from None
    if lengths_t.is_floating_point() or lengths_t.is_complex() or lengths_t.dtype == torch.bool:
        raise TypeError(f"{module_name}: lengths must be integers, got dtype {lengths_t.dtype}")
    if lengths_t.shape != (batch,):
        raise ValueError(
            f"{module_name}: lengths must have shape [B] = [{batch}], got {tuple(lengths_t.shape)}"
        )
    if torch.compiler.is_compiling():  # torch.compile or torch.export
        # A graph being traced cannot branch on tensor values: it asserts them at run time.
        in_range = (lengths_t.min() >= 0) & (lengths_t.max() <= steps)
        torch._assert_async(in_range, f"{module_name}: every length must lie in 0..T = 0..{steps}")
        return lengths_t.to(device=device, dtype=torch.long)
    low, high = int(lengths_t.min()), int(lengths_t.max())
    if low < 0 or high > steps:
        raise ValueError(
            f"{module_name}: every length must lie in 0..T = 0..{steps}; got values from "
            f"{low} to {high} in lengths"
        )
    return lengths_t.to(device=device, dtype=torch.long)


def finish_sequence(
    outputs: Tensor, seq: SequenceInput, batch_first: bool
) -> Tensor | PackedSequence:
    """Turn time-major outputs ``[T, B, O]`` back into the caller's layout."""
    if seq.packed:
        assert seq.lengths is not None
        return pack_padded_sequence(outputs, seq.lengths.cpu(), enforce_sorted=False)
    return outputs.transpose(0, 1) if batch_first else outputs


def run_cell_loop(
    cell: Callable[[Tensor, Any], tuple[Tensor, Any]],
    inputs: Tensor,
    state: Any,
    lengths: Tensor | None,
) -> tuple[Tensor, Any]:
    """The reference time loop: apply ``cell`` step by step.

    Args:
        cell: ``cell(input_t, state) -> (output_t, state)``.
        inputs: ``[T, B, ...]`` time-major input.
        state: initial state (batch-leading tensors).
        lengths: optional ``[B]`` int64. For ``t >= lengths[b]`` the state of example ``b`` is
            carried unchanged and its output is zero.

    Returns:
        ``(outputs [T, B, O], final_state)``.
    """
    outputs = []
    for t in range(inputs.shape[0]):
        output, new_state = cell(inputs[t], state)
        if lengths is None:
            state = new_state
        else:
            active = lengths > t  # [B]
            state = where_active(active, new_state, state)
            output = where_active(active, output, torch.zeros_like(output))
        outputs.append(output)
    return torch.stack(outputs), state


def run_recomputed(
    run: Callable[[Tensor, Any, Tensor | None], tuple[tuple[Tensor, ...], Any]],
    inputs: Tensor,
    state: Any,
    lengths: Tensor | None,
    chunk: int | None,
) -> tuple[tuple[Tensor, ...], Any]:
    """``run`` over ``inputs`` in chunks of ``chunk`` steps, each under activation
    checkpointing: the backward keeps each chunk's input state and recomputes the chunk, so
    autograd holds one chunk's intermediates at a time instead of the whole sequence's, for
    about one more forward pass.

    Args:
        run: ``run(inputs [t, B, ...], state, lengths [B] or None) -> (outputs, final state)``,
            each output ``[t, B, ...]`` (time-major); a finished example keeps its state.
        inputs: ``[T, B, ...]``. state: the initial state. lengths: ``[B]`` or None.
        chunk: steps per chunk; None, or a sequence no longer than one chunk, or no autograd
            recording (``torch.no_grad``) runs ``run`` once over the whole sequence.

    Returns:
        ``run``'s outputs joined over time, and the final state: the same values as ``run``
        over the whole sequence, and the same gradients.
    """
    steps = inputs.shape[0]
    if chunk is None or steps <= chunk or not torch.is_grad_enabled():
        return run(inputs, state, lengths)
    pieces = []
    for start in range(0, steps, chunk):
        stop = min(start + chunk, steps)
        # a chunk's lengths count from its first step: 0 for an example already finished
        piece_lengths = None if lengths is None else (lengths - start).clamp(0, stop - start)
        # Early stop ends a recomputation by raising from the hook that saves a tensor; where
        # the last op of the chunk is a custom autograd function (the fused DNC sequence), that
        # leaks the function's saved tensors, a chunk's worth per chunk and pass (seen with
        # torch 2.13; pytorch/pytorch#161186). The chunk ends with its recurrence, so stopping
        # early would save nothing anyway.
        with torch.utils.checkpoint.set_checkpoint_early_stop(False):
            outputs, state = torch.utils.checkpoint.checkpoint(
                run, inputs[start:stop], state, piece_lengths, use_reentrant=False
            )
        pieces.append(outputs)
    return tuple(torch.cat(parts) for parts in zip(*pieces, strict=True)), state


def check_state_tensor(
    module_name: str,
    field: str,
    tensor: Any,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
) -> None:
    """Raise a descriptive error unless ``tensor`` has the expected shape, dtype and device."""
    if not isinstance(tensor, Tensor):
        raise TypeError(
            f"{module_name}: state.{field} must be a tensor of shape {list(shape)}, "
            f"got {type(tensor).__name__}"
        )
    if tuple(tensor.shape) != shape:
        for dim, (want, got) in enumerate(zip(shape, tensor.shape, strict=False)):
            if want != got:
                what = "batch size" if dim == 0 else f"dim {dim}"
                raise ValueError(
                    f"{module_name}: state.{field} {what} mismatch: expected shape "
                    f"{list(shape)}, got {list(tensor.shape)}"
                )
        raise ValueError(
            f"{module_name}: state.{field} must have shape {list(shape)}, got {list(tensor.shape)}"
        )
    if tensor.dtype != dtype:
        raise TypeError(
            f"{module_name}: state.{field} has dtype {tensor.dtype} but the module computes in "
            f"{dtype}; convert it with .to({dtype})"
        )
    if tensor.device != device:
        raise ValueError(
            f"{module_name}: state.{field} is on {tensor.device} but the module is on {device}; "
            f"move it with .to({str(device)!r})"
        )
