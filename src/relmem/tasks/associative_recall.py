"""Associative recall (``docs/dnc.md`` §15.3): config, generator, task and preset.

:class:`AssociativeRecallConfig` holds the fields and their checks once and generates batches
(time-major for library use); :class:`AssociativeRecall` is the same generator under its
library name, whose errors name the class. :class:`AssociativeRecallTask` is the trainer's
view (``relmem train associative-recall``); groups break the bit errors down by item count.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from relmem.models import DNCModelConfig, LSTMModelConfig
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
from relmem.tasks.repeat_copy import repeat_copy_cpu
from relmem.train.config import TrainConfig
from relmem.validation import check_int


@dataclass
class AssociativeRecallConfig:
    """Associative recall (NTM paper; layout is the library's, ``docs/dnc.md`` §15.3).

    Each of c ~ U{min_items..max_items} items is ``item_length`` vectors of ``num_bits`` bits.
    Input (width ``num_bits + 2``): per item a delimiter row (channel ``num_bits``) and its
    rows; then a query delimiter (channel ``num_bits + 1``), the query item's rows, another
    query delimiter, and ``item_length`` zero rows during which the target is the item that
    followed the query. The query is uniform among items 1..c−1. Target width ``num_bits``;
    the mask covers only the answer rows. Length ``(item_length + 1)·c + 2·item_length + 2``.
    The defaults are the NTM paper's sizes.

    Attributes:
        num_bits: bits per item vector (NTM: 6).
        item_length: vectors per item (NTM: 3).
        min_items: the fewest items c (uniform on min_items..max_items; NTM: 2-6).
        max_items: the most items c.
        test_size: sequences in the fixed held-out set.
        test_seed: seed of the held-out set; independent of the training seed.
    """

    num_bits: int = 6
    item_length: int = 3
    min_items: int = 2
    max_items: int = 6
    test_size: int = 1000
    test_seed: int = TEST_SEED

    owner: ClassVar[str | None] = None  # None: errors name the option (task.num_bits)

    def __post_init__(self) -> None:
        minimums = {"num_bits": 1, "item_length": 1, "min_items": 2, "max_items": 2}
        minimums["test_size"] = 1
        check_fields(self, minimums, (("min_items", "max_items"),), self.owner)

    @property
    def input_size(self) -> int:
        """``num_bits + 2``: bits, item delimiter, query delimiter."""
        return self.num_bits + 2

    @property
    def target_size(self) -> int:
        """``num_bits``: the answer item's bits."""
        return self.num_bits

    @property
    def max_steps(self) -> int:
        """The longest possible example, ``(item_length + 1)·max_items + 2·item_length + 2``."""
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
        """Draw a batch (see :class:`~relmem.tasks.bits.TaskBatch`); T is the batch's longest
        example. Time-major ``[T, B, ·]`` unless ``batch_first``."""
        check_int("batch_size", batch_size, 1, owner=type(self).__name__)
        nb, il = self.num_bits, self.item_length
        count = randint(self.min_items, self.max_items, batch_size, generator)  # [B] c
        # query q in 1..c−1 (1-based) is 0-based index 0..c−2: floor(U·(c−1))
        device = count.device
        uniform = torch.rand(batch_size, generator=generator, device=device)
        query = (uniform * (count - 1)).long().clamp(max=count - 2)  # [B] 0-based
        items = random_bits((batch_size, self.max_items, il, nb), generator)  # [B, C, il, nb]
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
        return finish(inputs, targets, in_answer.float(), total, device, dtype, batch_first)


class AssociativeRecall(AssociativeRecallConfig):
    """The associative-recall generator for library use: :class:`AssociativeRecallConfig`
    whose errors name the class and require ``int`` values."""

    owner: ClassVar[str | None] = "AssociativeRecall"


class AssociativeRecallTask(BitTask):
    """Associative recall for the trainer; groups are the number of items c.

    Args:
        config: :class:`AssociativeRecallConfig`.
    """

    group_name = "number of items"

    def __init__(self, config: AssociativeRecallConfig) -> None:
        super().__init__(config, config.test_size, config.test_seed)
        self.config = config
        self.num_groups = config.max_items - config.min_items + 1

    def groups(self, batch: TaskBatch) -> Tensor:
        """``c - min_items``, from the length ``(item_length + 1)·c + 2·item_length + 2``."""
        il = self.config.item_length
        return (batch.lengths - 2 * il - 2) // (il + 1) - self.config.min_items

    def group_label(self, group: int) -> str:
        """``'c items'``."""
        return f"{self.config.min_items + group} items"


@register_task("associative-recall", AssociativeRecallConfig)
def build_associative_recall(config: AssociativeRecallConfig) -> AssociativeRecallTask:
    """Registry builder for ``relmem train associative-recall``."""
    return AssociativeRecallTask(config)


@register_preset("associative-recall", "cpu", default=True)
def associative_recall_cpu() -> TrainConfig[AssociativeRecallConfig]:
    """Associative recall with the NTM sizes (``docs/dnc.md`` §15.3: items of 3 x 6 bits,
    2-6 items).

    :func:`~relmem.tasks.repeat_copy.copy_cpu`'s optimiser and 10 minutes (the step cap
    lifted to 100k so that the time binds); the DNC gets N=32 slots (6 items of 4 rows fit) of
    W=16 and 4 read heads; the LSTM 128 units. Sequences are up to 32 steps.
    """
    return dataclasses.replace(
        repeat_copy_cpu(),
        steps=100_000,
        task=AssociativeRecallConfig(),
        lstm=LSTMModelConfig(hidden_size=128),
        dnc=DNCModelConfig(hidden_size=64, memory_size=32, word_size=16, num_read_heads=4),
    )
