"""Repeat copy and copy (``docs/dnc.md`` §15.1-§15.2): config, generator, task and presets.

:class:`RepeatCopyConfig` holds the task's fields and their checks once and generates batches
(:meth:`RepeatCopyConfig.sample`, time-major for library use); :class:`RepeatCopy` is the same
generator under its library name, whose errors name the class. :class:`CopyConfig` is repeat
copy with one repeat and the NTM paper's sizes. :class:`RepeatCopyTask` is the trainer's view
of both (``relmem train repeat-copy | copy``); groups break the bit errors down by pattern
length and repeat count.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from relmem.models import DNCModelConfig, LSTMModelConfig, RMCModelConfig
from relmem.tasks.bits import (
    TEST_SEED,
    BitTask,
    TaskBatch,
    check_fields,
    finish,
    randint,
    random_bits,
)
from relmem.tasks.registry import register_preset, register_task
from relmem.train.config import OptimConfig, TrainConfig
from relmem.validation import check_int


@dataclass
class RepeatCopyConfig:
    """Repeat copy, exactly as ``deepmind/dnc`` ``dnc/repeat_copy.py`` (``docs/dnc.md`` §15.1).

    Per example: a pattern of ℓ ~ U{min_length..max_length} vectors of ``num_bits`` fair bits
    and a repeat count k ~ U{min_repeats..max_repeats}. Observation (width ``num_bits + 2``):
    a start row (channel ``num_bits``), the ℓ pattern rows, a row holding ``k / norm_max`` in
    channel ``num_bits + 1``, then ``ℓk + 1`` zero rows. Target (width ``num_bits + 1``):
    ``ℓ + 2`` zero rows, the pattern tiled k times, then an end row (channel ``num_bits``).
    The mask is 1 on the last ``ℓk + 1`` steps. Length ``ℓ(k + 1) + 3``.

    The defaults are ``deepmind/dnc`` ``train.py``'s (``docs/dnc.md`` §14).

    Attributes:
        num_bits: bits per pattern vector.
        min_length: the shortest pattern ℓ (uniform on min_length..max_length).
        max_length: the longest pattern ℓ.
        min_repeats: the fewest repeats k (uniform on min_repeats..max_repeats).
        max_repeats: the most repeats k.
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

    owner: ClassVar[str | None] = None  # None: errors name the option (task.num_bits)

    def __post_init__(self) -> None:
        minimums = {"num_bits": 1, "min_length": 1, "max_length": 1, "min_repeats": 1}
        minimums |= {"max_repeats": 1, "test_size": 1}
        orders = (("min_length", "max_length"), ("min_repeats", "max_repeats"))
        check_fields(self, minimums, orders, self.owner)
        if not isinstance(self.norm_max, (int, float)) or not self.norm_max > 0:
            prefix = "task." if self.owner is None else f"{self.owner}: "
            raise ValueError(f"{prefix}norm_max must be > 0, got {self.norm_max!r}")

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
        """Draw a batch (see :class:`~relmem.tasks.bits.TaskBatch`); T is the batch's longest
        example. Time-major ``[T, B, ·]`` unless ``batch_first``."""
        check_int("batch_size", batch_size, 1, owner=type(self).__name__)
        nb = self.num_bits
        length = randint(self.min_length, self.max_length, batch_size, generator)  # [B]
        repeats = randint(self.min_repeats, self.max_repeats, batch_size, generator)  # [B]
        pattern = random_bits((batch_size, self.max_length, nb), generator)  # [B, Lmax, nb]
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
        return finish(inputs, targets, mask, total, device, dtype, batch_first)


class RepeatCopy(RepeatCopyConfig):
    """The repeat-copy generator for library use: :class:`RepeatCopyConfig` whose errors name
    the class and require ``int`` values (``RepeatCopy: num_bits must be an integer >= 1``)."""

    owner: ClassVar[str | None] = "RepeatCopy"


def copy_task(num_bits: int = 8, min_length: int = 1, max_length: int = 20) -> RepeatCopy:
    """Copy = repeat copy with one repeat; defaults are the NTM sizes (``docs/dnc.md`` §15.2)."""
    return RepeatCopy(num_bits, min_length, max_length, min_repeats=1, max_repeats=1)


@dataclass
class CopyConfig:
    """Copy: repeat copy with one repeat (``docs/dnc.md`` §15.2); the defaults are the NTM
    paper's sizes.

    Attributes:
        num_bits: bits per pattern vector (NTM: 8).
        min_length: the shortest pattern (uniform on min_length..max_length; NTM: 1-20).
        max_length: the longest pattern.
        test_size: sequences in the fixed held-out set.
        test_seed: seed of the held-out set; independent of the training seed.
    """

    num_bits: int = 8
    min_length: int = 1
    max_length: int = 20
    test_size: int = 1000
    test_seed: int = TEST_SEED

    def __post_init__(self) -> None:
        self.generator()  # its checks are the ones of these fields

    def generator(self) -> RepeatCopyConfig:
        """The repeat copy of these settings with ``min_repeats = max_repeats = 1``."""
        return RepeatCopyConfig(
            self.num_bits,
            self.min_length,
            self.max_length,
            min_repeats=1,
            max_repeats=1,
            test_size=self.test_size,
            test_seed=self.test_seed,
        )


class RepeatCopyTask(BitTask):
    """Repeat copy (and copy) for the trainer; groups are (pattern length ℓ, repeats k).

    Args:
        config: :class:`RepeatCopyConfig` or :class:`CopyConfig`.
    """

    def __init__(self, config: RepeatCopyConfig | CopyConfig) -> None:
        source = config.generator() if isinstance(config, CopyConfig) else config
        super().__init__(source, source.test_size, source.test_seed)
        self.config = config
        self.num_lengths = source.max_length - source.min_length + 1
        self.num_repeats = source.max_repeats - source.min_repeats + 1
        self.num_groups = self.num_lengths * self.num_repeats
        self.group_name = "pattern length" + (" and repeats" if self.num_repeats > 1 else "")

    def groups(self, batch: TaskBatch) -> Tensor:
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


@register_task("repeat-copy", RepeatCopyConfig)
def build_repeat_copy(config: RepeatCopyConfig) -> RepeatCopyTask:
    """Registry builder for ``relmem train repeat-copy``."""
    return RepeatCopyTask(config)


@register_task("copy", CopyConfig)
def build_copy(config: CopyConfig) -> RepeatCopyTask:
    """Registry builder for ``relmem train copy``."""
    return RepeatCopyTask(config)


@register_preset("repeat-copy", "cpu", default=True)
def repeat_copy_cpu() -> TrainConfig[RepeatCopyConfig]:
    """Repeat copy on a 2-core CPU: the DNC reaches near-zero bit error in about 10 minutes.

    ``deepmind/dnc`` ``train.py``'s task and model (``docs/dnc.md`` §14: 4 bits, pattern length 1-2,
    repeats 1-2, batch 16; controller 64, N=16, W=16, R=4, Wh=1, clip 20; gradients clipped to
    global norm 50) with one change: Adam 1e-3 instead of RMSProp 1e-4 (deepmind's 100k
    steps). ``--model lstm`` is the baseline: one ``nn.LSTM`` layer of 64 units and a linear
    readout. ``--model rmc``: N=4 slots, H=2 heads of D=16. 1,000 held-out sequences; 20k
    steps or 10 minutes; one CPU thread. ``benchmarks/dnc_repeat_copy.py`` runs it.
    """
    return TrainConfig(
        task=RepeatCopyConfig(),
        model="dnc",
        rmc=RMCModelConfig(mem_slots=4, head_size=16, num_heads=2),
        lstm=LSTMModelConfig(hidden_size=64),
        dnc=DNCModelConfig(
            hidden_size=64, memory_size=16, word_size=16, num_read_heads=4, num_write_heads=1
        ),
        optim=OptimConfig(lr=1e-3, grad_clip=50.0),
        steps=20_000,
        batch_size=16,
        eval_every=500,
        eval_batch=256,
        log_every=100,
        checkpoint_every=2000,
        time_limit_min=10.0,
        cpu_threads=1,
    )


@register_preset("copy", "cpu", default=True)
def copy_cpu() -> TrainConfig[CopyConfig]:
    """Copy with the NTM sizes (``docs/dnc.md`` §15.2: 8 bits, lengths 1-20) on a CPU budget.

    :func:`repeat_copy_cpu`'s optimiser (Adam 1e-3, clip 50, batch 16) for 10 minutes: the step
    cap is lifted to 100k so that the time binds (the fused DNC step runs 20k steps in about 6
    of them, and one seed of two leaves its plateau only after that); the DNC gets N=32 slots
    (a 20-vector pattern must fit) of W=16 and one read head (copying follows the temporal
    link); the LSTM 128 units. Sequences are up to 43 steps (``docs/results.md``, "Copy and
    associative recall").
    """
    return dataclasses.replace(
        repeat_copy_cpu(),
        steps=100_000,
        task=CopyConfig(),
        lstm=LSTMModelConfig(hidden_size=128),
        dnc=DNCModelConfig(hidden_size=64, memory_size=32, word_size=16, num_read_heads=1),
    )
