"""Algorithmic memory tasks: copy, repeat copy and associative recall (``specs/dnc.md`` 15).

Every generator is vectorised over the batch, draws all randomness from an optional
``torch.Generator`` (so a seed fixes the data whatever the device), and returns a
:class:`TaskBatch` with time-major tensors (``batch_first=True`` transposes them):

- ``inputs``: ``[T, B, input_size]`` observations;
- ``targets``: ``[T, B, target_size]`` bits to predict, in {0, 1};
- ``mask``: ``[T, B]`` 1 on the steps that are scored, else 0;
- ``lengths``: ``[B]`` int64, each example's unpadded length (examples are right-padded with
  zeros, mask included, to the longest one).

The loss is :func:`masked_sigmoid_cross_entropy` (summed over bits and masked steps, divided by
the batch size, as ``deepmind/dnc``) and the metric is :func:`bit_errors` (wrong bits per
sequence after rounding ``σ(logits)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor


class TaskBatch(NamedTuple):
    """One batch of a sequence task (time-major unless generated with ``batch_first``).

    Attributes:
        inputs: ``[T, B, input_size]``.
        targets: ``[T, B, target_size]``.
        mask: ``[T, B]``, 1.0 where the target is scored.
        lengths: ``[B]`` int64 valid lengths (for the models' ``lengths=`` argument).
    """

    inputs: Tensor
    targets: Tensor
    mask: Tensor
    lengths: Tensor


def _check_int(owner: str, name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{owner}: {name} must be an integer >= {minimum}, got {value!r}")


def _check_range(owner: str, low_name: str, low: int, high_name: str, high: int) -> None:
    if low > high:
        raise ValueError(f"{owner}: {low_name} = {low} must be <= {high_name} = {high}")


def _randint(low: int, high: int, size: int, generator: torch.Generator | None) -> Tensor:
    """``[size]`` int64 uniform on ``low..high`` inclusive, on the generator's device."""
    device = generator.device if generator is not None else None
    return torch.randint(low, high + 1, (size,), generator=generator, device=device)


def _bits(shape: tuple[int, ...], generator: torch.Generator | None) -> Tensor:
    """Fair random bits (float32 0/1) on the generator's device."""
    device = generator.device if generator is not None else None
    return torch.randint(0, 2, shape, generator=generator, device=device).float()


def _finish(
    inputs: Tensor,
    targets: Tensor,
    mask: Tensor,
    lengths: Tensor,
    device: torch.device | str | None,
    dtype: torch.dtype,
    batch_first: bool,
) -> TaskBatch:
    batch = TaskBatch(
        inputs.to(device=device, dtype=dtype),
        targets.to(device=device, dtype=dtype),
        mask.to(device=device, dtype=dtype),
        lengths.to(device=device),
    )
    if batch_first:
        return TaskBatch(
            batch.inputs.transpose(0, 1),
            batch.targets.transpose(0, 1),
            batch.mask.transpose(0, 1),
            batch.lengths,
        )
    return batch


@dataclass(frozen=True)
class RepeatCopy:
    """Repeat copy, exactly as ``deepmind/dnc`` ``dnc/repeat_copy.py`` (spec 15.1).

    Per example: a pattern of ℓ ~ U{min_length..max_length} vectors of ``num_bits`` fair bits
    and a repeat count k ~ U{min_repeats..max_repeats}. Observation (width ``num_bits + 2``):
    a start row (channel ``num_bits``), the ℓ pattern rows, a row holding ``k / norm_max`` in
    channel ``num_bits + 1``, then ``ℓk + 1`` zero rows. Target (width ``num_bits + 1``):
    ``ℓ + 2`` zero rows, the pattern tiled k times, then an end row (channel ``num_bits``).
    The mask is 1 on the last ``ℓk + 1`` steps. Length ``ℓ(k + 1) + 3``.

    The defaults are ``deepmind/dnc`` ``train.py``'s (spec section 14).
    """

    num_bits: int = 4
    min_length: int = 1
    max_length: int = 2
    min_repeats: int = 1
    max_repeats: int = 2
    norm_max: float = 10.0

    def __post_init__(self) -> None:
        name = type(self).__name__
        _check_int(name, "num_bits", self.num_bits, 1)
        _check_int(name, "min_length", self.min_length, 1)
        _check_int(name, "max_length", self.max_length, 1)
        _check_int(name, "min_repeats", self.min_repeats, 1)
        _check_int(name, "max_repeats", self.max_repeats, 1)
        _check_range(name, "min_length", self.min_length, "max_length", self.max_length)
        _check_range(name, "min_repeats", self.min_repeats, "max_repeats", self.max_repeats)
        if not isinstance(self.norm_max, (int, float)) or not self.norm_max > 0:
            raise ValueError(f"{name}: norm_max must be > 0, got {self.norm_max!r}")

    @property
    def input_size(self) -> int:
        """``num_bits + 2``: bits, start channel, repeat channel."""
        return self.num_bits + 2

    @property
    def target_size(self) -> int:
        """``num_bits + 1``: bits, end channel."""
        return self.num_bits + 1

    @property
    def max_steps(self) -> int:
        """The longest possible example, ``max_length·(max_repeats + 1) + 3``."""
        return self.max_length * (self.max_repeats + 1) + 3

    def sample(
        self,
        batch_size: int,
        *,
        generator: torch.Generator | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
        batch_first: bool = False,
    ) -> TaskBatch:
        """Draw a batch (see :class:`TaskBatch`); T is the batch's longest example."""
        _check_int(type(self).__name__, "batch_size", batch_size, 1)
        nb = self.num_bits
        length = _randint(self.min_length, self.max_length, batch_size, generator)  # [B]
        repeats = _randint(self.min_repeats, self.max_repeats, batch_size, generator)  # [B]
        pattern = _bits((batch_size, self.max_length, nb), generator)  # [B, Lmax, nb]
        total = length * (repeats + 1) + 3  # [B]
        steps = int(total.max())
        t = torch.arange(steps, device=length.device).unsqueeze(1)  # [T, 1]

        inputs = torch.zeros(steps, batch_size, nb + 2, device=length.device)
        in_pattern = (t >= 1) & (t <= length)  # [T, B]
        rows = (t - 1).clamp(0, self.max_length - 1).expand(steps, batch_size)  # [T, B]
        gathered = pattern[torch.arange(batch_size), rows]  # [T, B, nb]
        inputs[..., :nb] = gathered * in_pattern.unsqueeze(-1)
        inputs[0, :, nb] = 1.0  # start flag
        repeat_row = t == length + 1  # [T, B]
        inputs[..., nb + 1] = repeat_row * (repeats.float() / self.norm_max)

        targets = torch.zeros(steps, batch_size, nb + 1, device=length.device)
        start = length + 2  # [B]
        end = start + length * repeats  # [B], the end-flag step
        in_copy = (t >= start) & (t < end)  # [T, B]
        copy_rows = torch.remainder(t - start, length).clamp(0, self.max_length - 1)  # [T, B]
        targets[..., :nb] = pattern[torch.arange(batch_size), copy_rows] * in_copy.unsqueeze(-1)
        targets[..., nb] = (t == end).float()
        mask = ((t >= start) & (t <= end)).float()  # [T, B]
        return _finish(inputs, targets, mask, total, device, dtype, batch_first)


def copy_task(num_bits: int = 8, min_length: int = 1, max_length: int = 20) -> RepeatCopy:
    """Copy = repeat copy with one repeat; defaults are the NTM sizes (spec 15.2)."""
    return RepeatCopy(num_bits, min_length, max_length, min_repeats=1, max_repeats=1)


@dataclass(frozen=True)
class AssociativeRecall:
    """Associative recall (NTM paper; layout is the library's, spec 15.3).

    Each of c ~ U{min_items..max_items} items is ``item_length`` vectors of ``num_bits`` bits.
    Input (width ``num_bits + 2``): per item a delimiter row (channel ``num_bits``) and its
    rows; then a query delimiter (channel ``num_bits + 1``), the query item's rows, another
    query delimiter, and ``item_length`` zero rows during which the target is the item that
    followed the query. The query is uniform among items 1..c−1. Target width ``num_bits``;
    the mask covers only the answer rows. Length ``(item_length + 1)·c + 2·item_length + 2``.
    """

    num_bits: int = 6
    item_length: int = 3
    min_items: int = 2
    max_items: int = 6

    def __post_init__(self) -> None:
        name = type(self).__name__
        _check_int(name, "num_bits", self.num_bits, 1)
        _check_int(name, "item_length", self.item_length, 1)
        _check_int(name, "min_items", self.min_items, 2)
        _check_int(name, "max_items", self.max_items, 2)
        _check_range(name, "min_items", self.min_items, "max_items", self.max_items)

    @property
    def input_size(self) -> int:
        """``num_bits + 2``: bits, item delimiter, query delimiter."""
        return self.num_bits + 2

    @property
    def target_size(self) -> int:
        return self.num_bits

    @property
    def max_steps(self) -> int:
        return (self.item_length + 1) * self.max_items + 2 * self.item_length + 2

    def sample(
        self,
        batch_size: int,
        *,
        generator: torch.Generator | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
        batch_first: bool = False,
    ) -> TaskBatch:
        """Draw a batch (see :class:`TaskBatch`); T is the batch's longest example."""
        _check_int(type(self).__name__, "batch_size", batch_size, 1)
        nb, il = self.num_bits, self.item_length
        count = _randint(self.min_items, self.max_items, batch_size, generator)  # [B] c
        # query q in 1..c−1 (1-based) is 0-based index 0..c−2: floor(U·(c−1))
        device = count.device
        uniform = torch.rand(batch_size, generator=generator, device=device)
        query = (uniform * (count - 1)).long().clamp(max=count - 2)  # [B] 0-based
        items = _bits((batch_size, self.max_items, il, nb), generator)  # [B, Cmax, il, nb]
        block = il + 1
        body = block * count  # [B] steps of the item list
        total = body + 2 * il + 2  # [B]
        steps = int(total.max())
        t = torch.arange(steps, device=device).unsqueeze(1)  # [T, 1]
        b = torch.arange(batch_size, device=device)  # [B]

        inputs = torch.zeros(steps, batch_size, nb + 2, device=device)
        in_body = t < body  # [T, B]
        item_index = (t // block).clamp(max=self.max_items - 1).expand(steps, batch_size)
        offset = (t % block).expand(steps, batch_size)  # 0 = delimiter, 1..il = rows
        item_rows = items[b, item_index, (offset - 1).clamp(min=0)]  # [T, B, nb]
        is_row = in_body & (offset > 0)
        inputs[..., :nb] = item_rows * is_row.unsqueeze(-1)
        inputs[..., nb] = (in_body & (offset == 0)).float()
        q_start = body + 1  # first query row
        in_query = (t >= q_start) & (t < q_start + il)  # [T, B]
        query_rows = items[b, query.expand(steps, batch_size), (t - q_start).clamp(0, il - 1)]
        inputs[..., :nb] += query_rows * in_query.unsqueeze(-1)
        inputs[..., nb + 1] = ((t == body) | (t == q_start + il)).float()

        a_start = q_start + il + 1  # first answer row
        in_answer = (t >= a_start) & (t < a_start + il)  # [T, B]
        answer_rows = items[
            b, (query + 1).expand(steps, batch_size), (t - a_start).clamp(0, il - 1)
        ]
        targets = answer_rows * in_answer.unsqueeze(-1)  # [T, B, nb]
        return _finish(inputs, targets, in_answer.float(), total, device, dtype, batch_first)


def masked_sigmoid_cross_entropy(
    logits: Tensor,
    targets: Tensor,
    mask: Tensor,
    *,
    time_average: bool = False,
    batch_first: bool = False,
) -> Tensor:
    """``deepmind/dnc``'s loss: sigmoid cross-entropy summed over bits and masked steps, / B.

    Args:
        logits: ``[T, B, C]`` (``[B, T, C]`` with ``batch_first``).
        targets: same shape, in [0, 1].
        mask: ``[T, B]`` (``[B, T]``).
        time_average: also divide each sequence's loss by its number of masked steps.
        batch_first: the layout of the three tensors.

    Returns:
        A scalar.
    """
    if logits.shape != targets.shape or logits.shape[:2] != mask.shape:
        raise ValueError(
            "masked_sigmoid_cross_entropy: expected logits and targets [T, B, C] and mask "
            f"[T, B]; got {tuple(logits.shape)}, {tuple(targets.shape)}, {tuple(mask.shape)}"
        )
    time_dim = 1 if batch_first else 0
    xent = F.binary_cross_entropy_with_logits(logits, targets, reduction="none").sum(-1)
    per_sequence = (xent * mask).sum(time_dim)  # [B]
    if time_average:
        per_sequence = per_sequence / (mask.sum(time_dim) + torch.finfo(torch.float32).eps)
    return per_sequence.sum() / logits.shape[1 - time_dim]


def bit_errors(
    logits: Tensor, targets: Tensor, mask: Tensor, *, batch_first: bool = False
) -> Tensor:
    """Wrong bits per sequence: ``Σ_{t,c} mask · [round(σ(logits)) ≠ targets]``.

    Args:
        logits, targets: ``[T, B, C]`` (``[B, T, C]`` with ``batch_first``).
        mask: ``[T, B]`` (``[B, T]``).

    Returns:
        ``[B]`` float; its mean is the "bit error per sequence" reported for these tasks.
    """
    if logits.shape != targets.shape or logits.shape[:2] != mask.shape:
        raise ValueError(
            f"bit_errors: expected logits and targets [T, B, C] and mask [T, B]; got "
            f"{tuple(logits.shape)}, {tuple(targets.shape)}, {tuple(mask.shape)}"
        )
    wrong = ((logits > 0).to(targets.dtype) != targets).to(mask.dtype).sum(-1)  # [T, B]
    return (wrong * mask).sum(1 if batch_first else 0)
