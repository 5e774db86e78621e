"""What copy, repeat copy and associative recall share (``docs/dnc.md`` §15).

- :class:`TaskBatch`, the generators' time-major output for library use (``batch_first=True``
  transposes it): ``inputs [T, B, input_size]``, ``targets [T, B, target_size]`` bits in
  {0, 1}, ``mask [T, B]`` (1 on the scored steps) and ``lengths [B]`` int64 (examples are
  right-padded with zeros, mask included, to the longest one);
- the loss, :func:`masked_sigmoid_cross_entropy` (summed over bits and masked steps, divided by
  the batch size, as ``deepmind/dnc``), and the metric, :func:`bit_errors` (wrong bits per
  sequence after rounding ``σ(logits)``);
- :class:`BitTask`, the trainer's view of the three: a fixed held-out set, the loss and the
  metric as per-sequence :class:`~relmem.tasks.base.Measure` sums;
- :func:`check_fields`: each task's limits are written once and checked in the two message
  styles of :mod:`relmem.validation`, the config's (``task.num_bits must be >= 1``) and the
  library generator's (``RepeatCopy: num_bits must be an integer >= 1``).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from relmem.tasks.base import BIT_ERRORS, Batch, Measure, Task, TaskSpec, step_generator
from relmem.validation import check_at_least, check_int, check_int_order, check_order

TEST_SEED = 20161012  # the DNC paper's publication date (Nature 538, 12 October 2016)


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


def check_fields(
    config: Any, minimums: dict[str, int], orders: tuple[tuple[str, str], ...], owner: str | None
) -> None:
    """Check ``config``'s fields against their minimums and ``(low, high)`` orders.

    Args:
        config: a task config or generator.
        minimums: field name -> smallest allowed value.
        orders: pairs of fields with ``low <= high``.
        owner: None for a config (messages name the option, ``task.max_length``); a class
            name for a library generator (messages name the class, values must be ``int``).

    Raises:
        ValueError: for the first field that fails.
    """
    if owner is None:
        check_at_least("task.", config, **minimums)
        for low, high in orders:
            check_order("task.", config, low, high)
        return
    for name, minimum in minimums.items():
        check_int(name, getattr(config, name), minimum, owner=owner)
    for low, high in orders:
        check_int_order(low, getattr(config, low), high, getattr(config, high), owner=owner)


def randint(low: int, high: int, size: int, generator: torch.Generator | None) -> Tensor:
    """``[size]`` int64 uniform on ``low..high`` inclusive, on the generator's device."""
    device = generator.device if generator is not None else None
    return torch.randint(low, high + 1, (size,), generator=generator, device=device)


def random_bits(shape: tuple[int, ...], generator: torch.Generator | None) -> Tensor:
    """Fair random bits (float32 0/1) on the generator's device."""
    device = generator.device if generator is not None else None
    return torch.randint(0, 2, shape, generator=generator, device=device).float()


def finish(
    inputs: Tensor,
    targets: Tensor,
    mask: Tensor,
    lengths: Tensor,
    device: torch.device | str | None,
    dtype: torch.dtype,
    batch_first: bool,
) -> TaskBatch:
    """A :class:`TaskBatch` of time-major tensors, moved and cast, transposed if asked."""
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


def _check_layout(caller: str, logits: Tensor, targets: Tensor, mask: Tensor) -> None:
    if logits.shape != targets.shape or logits.shape[:2] != mask.shape:
        raise ValueError(
            f"{caller}: expected logits and targets [T, B, C] and mask [T, B]; got "
            f"{tuple(logits.shape)}, {tuple(targets.shape)}, {tuple(mask.shape)}"
        )


def sequence_cross_entropy(
    logits: Tensor, targets: Tensor, mask: Tensor, *, batch_first: bool = False
) -> Tensor:
    """Sigmoid cross-entropy of each sequence, summed over bits and masked steps.

    Args:
        logits, targets: ``[T, B, C]`` (``[B, T, C]`` with ``batch_first``).
        mask: ``[T, B]`` (``[B, T]``).

    Returns:
        ``[B]``.
    """
    _check_layout("masked_sigmoid_cross_entropy", logits, targets, mask)
    xent = F.binary_cross_entropy_with_logits(logits, targets, reduction="none").sum(-1)
    return (xent * mask).sum(1 if batch_first else 0)


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
    per_sequence = sequence_cross_entropy(logits, targets, mask, batch_first=batch_first)
    if time_average:
        steps = mask.sum(1 if batch_first else 0)
        per_sequence = per_sequence / (steps + torch.finfo(torch.float32).eps)
    return per_sequence.sum() / per_sequence.shape[0]


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
    _check_layout("bit_errors", logits, targets, mask)
    wrong = ((logits > 0).to(targets.dtype) != targets).to(mask.dtype).sum(-1)  # [T, B]
    return (wrong * mask).sum(1 if batch_first else 0)


class BitSource(Protocol):
    """A generator of :class:`TaskBatch` es (repeat copy, associative recall)."""

    @property
    def input_size(self) -> int: ...

    @property
    def target_size(self) -> int: ...

    @property
    def max_steps(self) -> int: ...

    def sample(
        self, batch_size: int, *, generator: torch.Generator | None = None, batch_first: bool
    ) -> TaskBatch: ...


class BitTask(Task):
    """The trainer's view of a bit task: sampling, the held-out set, the loss and the metric.

    Batches are ``inputs [B, T, I]``, ``targets [B, T, O]``, ``groups [B]``, ``mask [B, T]``
    and ``lengths [B]`` (right-padded to the batch's longest example); the model emits
    ``logits [B, T, O]`` and receives ``lengths``. Subclasses set ``group_name`` and
    ``num_groups`` and implement :meth:`groups` and :meth:`group_label`.

    Args:
        source: the generator.
        test_size: sequences in the fixed held-out set.
        test_seed: its seed.
    """

    metric = BIT_ERRORS

    def __init__(self, source: BitSource, test_size: int, test_seed: int) -> None:
        self.source = source
        self.test_size = test_size
        self.test_seed = test_seed
        self.spec = TaskSpec(
            input_size=source.input_size,
            seq_len=source.max_steps,
            output_size=source.target_size,
            output="per_step",
        )

    @abstractmethod
    def groups(self, batch: TaskBatch) -> Tensor:
        """``[B]`` int64 group ids of a batch-first :class:`TaskBatch`."""

    def sample(self, batch_size: int, generator: torch.Generator, step: int = 0) -> Batch:
        """A fresh batch on ``generator.device`` (the distribution does not move with
        ``step``); T is the batch's longest example."""
        raw = self.source.sample(batch_size, generator=generator, batch_first=True)
        return Batch(raw.inputs, raw.targets, self.groups(raw), raw.mask, raw.lengths)

    def held_out(self, device: torch.device) -> Batch:
        """The fixed held-out set of ``test_size`` sequences drawn from ``test_seed``.

        It is drawn on the CPU and moved to ``device``, so it is bit-identical on every device.
        """
        generator = step_generator(torch.device("cpu"), self.test_seed)
        return self.sample(self.test_size, generator).to(device)

    def measure(self, logits: Tensor, batch: Batch) -> dict[str, Measure]:
        """Per sequence: ``'loss'``, the sigmoid cross-entropy of ``logits [B, T, O]`` summed
        over bits and masked steps (its mean over the batch is ``deepmind/dnc``'s loss), and
        ``'bit_errors'``, the wrong bits after rounding ``σ(logits)``."""
        assert batch.mask is not None
        xent = sequence_cross_entropy(logits.float(), batch.targets, batch.mask, batch_first=True)
        wrong = bit_errors(logits, batch.targets, batch.mask, batch_first=True)
        return {"loss": Measure.per_example(xent), "bit_errors": Measure.per_example(wrong)}
