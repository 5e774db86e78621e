"""Copy, repeat copy and associative recall as trainer tasks (``specs/dnc.md`` section 15).

The generators live in :mod:`relmem.tasks.copy_tasks`; this module gives them config
dataclasses, a fixed held-out set and the :class:`~relmem.tasks.base.Task` interface, and
registers them as ``relmem train copy | repeat-copy | associative-recall``.

All three are per-step tasks: a batch is ``inputs [B, T, I]``, ``targets [B, T, O]``,
``mask [B, T]`` and ``lengths [B]`` (right-padded to the longest example), the model emits
``logits [B, T, O]`` and receives ``lengths``. The loss is ``deepmind/dnc``'s sigmoid
cross-entropy summed over bits and masked steps, divided by the batch size; the metric is the
bit error per sequence (lower is better). Groups break the metric down by pattern length and
repeat count (copy, repeat copy) or by the number of items (associative recall).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import Tensor

from relmem.tasks.base import BIT_ERRORS, Batch, TaskSpec, register_task, step_generator
from relmem.tasks.copy_tasks import (
    AssociativeRecall,
    RepeatCopy,
    TaskBatch,
    bit_errors,
    masked_sigmoid_cross_entropy,
)

TEST_SEED = 20161012  # the DNC paper's publication date (Nature 538, 12 October 2016)


def _check_at_least(config: object, **minimums: int) -> None:
    for name, minimum in minimums.items():
        value = getattr(config, name)
        if value < minimum:
            raise ValueError(f"task.{name} must be >= {minimum}, got {value}")


def _check_order(config: object, low: str, high: str) -> None:
    if getattr(config, low) > getattr(config, high):
        raise ValueError(
            f"task.{low} ({getattr(config, low)}) must be <= task.{high} ({getattr(config, high)})"
        )


@dataclass
class RepeatCopyConfig:
    """Repeat copy (spec 15.1); the defaults are ``deepmind/dnc`` ``train.py``'s (spec 14).

    Attributes:
        num_bits: bits per pattern vector.
        min_length, max_length: the pattern length ℓ is uniform on this range.
        min_repeats, max_repeats: the repeat count k is uniform on this range.
        norm_max: the repeat channel holds ``k / norm_max``.
        test_size: sequences in the fixed held-out set.
        test_seed: seed of the held-out set; independent of the training seed.
    """

    num_bits: int = 4
    min_length: int = 1
    max_length: int = 2
    min_repeats: int = 1
    max_repeats: int = 2
    norm_max: float = 10.0
    test_size: int = 1000
    test_seed: int = TEST_SEED

    def __post_init__(self) -> None:
        _check_at_least(
            self, num_bits=1, min_length=1, max_length=1, min_repeats=1, max_repeats=1, test_size=1
        )
        _check_order(self, "min_length", "max_length")
        _check_order(self, "min_repeats", "max_repeats")
        if not self.norm_max > 0:
            raise ValueError(f"task.norm_max must be > 0, got {self.norm_max}")

    def generator(self) -> RepeatCopy:
        """The :class:`RepeatCopy` generator of these settings."""
        return RepeatCopy(
            self.num_bits,
            self.min_length,
            self.max_length,
            self.min_repeats,
            self.max_repeats,
            self.norm_max,
        )


@dataclass
class CopyConfig:
    """Copy: repeat copy with one repeat (spec 15.2); the defaults are the NTM paper's sizes.

    Attributes:
        num_bits: bits per pattern vector (NTM: 8).
        min_length, max_length: the pattern length is uniform on this range (NTM: 1-20).
        test_size: sequences in the fixed held-out set.
        test_seed: seed of the held-out set; independent of the training seed.
    """

    num_bits: int = 8
    min_length: int = 1
    max_length: int = 20
    test_size: int = 1000
    test_seed: int = TEST_SEED

    def __post_init__(self) -> None:
        _check_at_least(self, num_bits=1, min_length=1, max_length=1, test_size=1)
        _check_order(self, "min_length", "max_length")

    def generator(self) -> RepeatCopy:
        """The :class:`RepeatCopy` generator with ``min_repeats = max_repeats = 1``."""
        return RepeatCopy(self.num_bits, self.min_length, self.max_length, 1, 1)


@dataclass
class AssociativeRecallConfig:
    """Associative recall (spec 15.3); the defaults are the NTM paper's sizes.

    Attributes:
        num_bits: bits per item vector (NTM: 6).
        item_length: vectors per item (NTM: 3).
        min_items, max_items: the number of items c is uniform on this range (NTM: 2-6).
        test_size: sequences in the fixed held-out set.
        test_seed: seed of the held-out set; independent of the training seed.
    """

    num_bits: int = 6
    item_length: int = 3
    min_items: int = 2
    max_items: int = 6
    test_size: int = 1000
    test_seed: int = TEST_SEED

    def __post_init__(self) -> None:
        _check_at_least(self, num_bits=1, item_length=1, min_items=2, max_items=2, test_size=1)
        _check_order(self, "min_items", "max_items")

    def generator(self) -> AssociativeRecall:
        """The :class:`AssociativeRecall` generator of these settings."""
        return AssociativeRecall(self.num_bits, self.item_length, self.min_items, self.max_items)


class _BitTask(ABC):
    """What the three tasks share: sampling, the held-out set, the loss and the metric.

    Subclasses set ``group_name`` and ``num_groups`` and implement :meth:`_groups` and
    :meth:`group_label`.
    """

    metric = BIT_ERRORS
    group_name: str
    num_groups: int

    def __init__(self, config: RepeatCopyConfig | CopyConfig | AssociativeRecallConfig) -> None:
        self.config = config
        self.source = config.generator()
        self.spec = TaskSpec(
            input_size=self.source.input_size,
            seq_len=self.source.max_steps,
            output_size=self.source.target_size,
            output="per_step",
        )

    @abstractmethod
    def _groups(self, batch: TaskBatch) -> Tensor:
        """``[B]`` int64 group ids of a batch-first :class:`TaskBatch`."""

    @abstractmethod
    def group_label(self, group: int) -> str:
        """A readable name for a group id (eval tables)."""

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        """A fresh batch on ``generator.device``: ``inputs [B, T, I]``, ``targets [B, T, O]``,
        ``groups [B]``, ``mask [B, T]``, ``lengths [B]``; T is the batch's longest example."""
        raw = self.source.sample(batch_size, generator=generator, batch_first=True)
        return Batch(raw.inputs, raw.targets, self._groups(raw), raw.mask, raw.lengths)

    def held_out(self, device: torch.device) -> Batch:
        """The fixed held-out set of ``test_size`` sequences drawn from ``test_seed``.

        It is drawn on the CPU and moved to ``device``, so it is bit-identical on every device.
        """
        generator = step_generator(torch.device("cpu"), self.config.test_seed)
        return self.sample(self.config.test_size, generator).to(device)

    def loss(self, logits: Tensor, batch: Batch) -> Tensor:
        """Sigmoid cross-entropy of ``logits [B, T, O]``, summed over bits and masked steps,
        divided by B (spec 15)."""
        assert batch.mask is not None
        return masked_sigmoid_cross_entropy(
            logits.float(), batch.targets, batch.mask, batch_first=True
        )

    def metrics(self, logits: Tensor, batch: Batch) -> dict[str, Tensor]:
        """``{'bit_errors': [B]}``: wrong bits per sequence after rounding ``σ(logits)``."""
        assert batch.mask is not None
        return {"bit_errors": bit_errors(logits, batch.targets, batch.mask, batch_first=True)}


class RepeatCopyTask(_BitTask):
    """Repeat copy (and copy) for the trainer; groups are (pattern length ℓ, repeats k).

    Args:
        config: :class:`RepeatCopyConfig` or :class:`CopyConfig`.
    """

    def __init__(self, config: RepeatCopyConfig | CopyConfig) -> None:
        super().__init__(config)
        source = self.source
        self.num_lengths = source.max_length - source.min_length + 1
        self.num_repeats = source.max_repeats - source.min_repeats + 1
        self.num_groups = self.num_lengths * self.num_repeats
        self.group_name = "pattern length" + (" and repeats" if self.num_repeats > 1 else "")

    def _groups(self, batch: TaskBatch) -> Tensor:
        """``(ℓ - min_length) · num_repeats + (k - min_repeats)``, from the layout: an example
        is ``ℓ(k + 1) + 3`` steps long with ``ℓk + 1`` of them masked."""
        scored = batch.mask.sum(1).round().long()  # [B] ℓk + 1
        length = batch.lengths - scored - 2  # [B] ℓ
        repeats = (scored - 1) // length  # [B] k
        source = self.source
        return (length - source.min_length) * self.num_repeats + repeats - source.min_repeats

    def group_label(self, group: int) -> str:
        """``'length ℓ'`` (copy) or ``'length ℓ, repeats k'``."""
        length = self.source.min_length + group // self.num_repeats
        if self.num_repeats == 1:
            return f"length {length}"
        return f"length {length}, repeats {self.source.min_repeats + group % self.num_repeats}"


class AssociativeRecallTask(_BitTask):
    """Associative recall for the trainer; groups are the number of items c.

    Args:
        config: :class:`AssociativeRecallConfig`.
    """

    group_name = "number of items"

    def __init__(self, config: AssociativeRecallConfig) -> None:
        super().__init__(config)
        self.num_groups = config.max_items - config.min_items + 1

    def _groups(self, batch: TaskBatch) -> Tensor:
        """``c - min_items``, from the length ``(item_length + 1)·c + 2·item_length + 2``."""
        il = self.config.item_length
        return (batch.lengths - 2 * il - 2) // (il + 1) - self.config.min_items

    def group_label(self, group: int) -> str:
        """``'c items'``."""
        return f"{self.config.min_items + group} items"


@register_task("repeat-copy", RepeatCopyConfig, default_preset="repeat_copy_cpu")
def build_repeat_copy(config: RepeatCopyConfig) -> RepeatCopyTask:
    """Registry builder for ``relmem train repeat-copy``."""
    return RepeatCopyTask(config)


@register_task("copy", CopyConfig, default_preset="copy_cpu")
def build_copy(config: CopyConfig) -> RepeatCopyTask:
    """Registry builder for ``relmem train copy``."""
    return RepeatCopyTask(config)


@register_task(
    "associative-recall", AssociativeRecallConfig, default_preset="associative_recall_cpu"
)
def build_associative_recall(config: AssociativeRecallConfig) -> AssociativeRecallTask:
    """Registry builder for ``relmem train associative-recall``."""
    return AssociativeRecallTask(config)
