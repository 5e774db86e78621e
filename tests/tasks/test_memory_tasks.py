"""Copy, repeat copy and associative recall through the trainer's Task contract."""

from __future__ import annotations

import math
import re

import pytest
import torch

from relmem.tasks import (
    AssociativeRecallConfig,
    CopyConfig,
    RepeatCopyConfig,
    get_task,
    masked_sigmoid_cross_entropy,
)
from relmem.tasks.base import ACCURACY, BIT_ERRORS, Batch, step_generator

CPU = torch.device("cpu")
CONFIGS = {
    "repeat-copy": RepeatCopyConfig(max_length=3, max_repeats=3, test_size=50),
    "copy": CopyConfig(num_bits=3, max_length=6, test_size=50),
    "associative-recall": AssociativeRecallConfig(num_bits=4, item_length=2, test_size=50),
}


def build(name: str):
    return get_task(name).build(CONFIGS[name])


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_batches_follow_the_per_step_contract(name: str) -> None:
    task = build(name)
    batch = task.sample(64, step_generator(CPU, 0, 1, 3))
    b, t, i = batch.inputs.shape
    assert b == 64 and i == task.spec.input_size and task.spec.per_step
    assert batch.targets.shape == (b, t, task.spec.output_size)
    assert batch.mask.shape == (b, t) and batch.lengths.shape == (b,)
    assert batch.lengths.dtype == torch.long and t == int(batch.lengths.max())
    assert t <= task.spec.seq_len
    steps = torch.arange(t).unsqueeze(0)  # [1, T]
    padded = steps >= batch.lengths.unsqueeze(1)  # [B, T]
    assert (batch.mask[padded] == 0).all() and (batch.inputs[padded] == 0).all()
    assert (batch.mask.sum(1) > 0).all()  # every sequence has scored steps
    assert batch.groups.dtype == torch.long
    assert int(batch.groups.min()) >= 0 and int(batch.groups.max()) < task.num_groups
    assert len(torch.unique(batch.groups)) == task.num_groups  # 64 draws hit every group


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_data_is_a_function_of_the_generator_and_held_out_is_fixed(name: str) -> None:
    task = build(name)
    a = task.sample(16, step_generator(CPU, 0, 1, 3))
    b = task.sample(16, step_generator(CPU, 0, 1, 3))
    c = task.sample(16, step_generator(CPU, 0, 1, 4))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert a.inputs.shape != c.inputs.shape or not torch.equal(a.inputs, c.inputs)
    first, second = task.held_out(CPU), build(name).held_out(CPU)
    assert first.inputs.shape[0] == 50
    assert all(torch.equal(x, y) for x, y in zip(first, second, strict=True))
    other_seed = get_task(name).build(type(CONFIGS[name])(test_size=50, test_seed=1))
    assert not torch.equal(first.targets, other_seed.held_out(CPU).targets)


def test_repeat_copy_groups_are_length_and_repeats() -> None:
    task = build("repeat-copy")
    batch = task.sample(200, step_generator(CPU, 5))
    nb = CONFIGS["repeat-copy"].num_bits
    for b in range(200):
        repeat_row = int(batch.inputs[b, :, nb + 1].nonzero()[0])  # the row holding k / 10
        length = repeat_row - 1
        repeats = round(batch.inputs[b, repeat_row, nb + 1].item() * 10)
        assert int(batch.groups[b]) == (length - 1) * 3 + repeats - 1
        assert task.group_label(int(batch.groups[b])) == f"length {length}, repeats {repeats}"
    copy = build("copy")
    assert copy.num_groups == 6 and copy.group_label(5) == "length 6"
    batch = copy.sample(100, step_generator(CPU, 5))
    pattern_rows = (batch.inputs[:, :, :3].abs().sum(-1) > 0).sum(1)  # ≤ ℓ rows hold bits
    assert (pattern_rows <= batch.groups + 1).all()
    assert torch.equal(batch.lengths, 2 * (batch.groups + 1) + 3)


def test_associative_recall_groups_count_items() -> None:
    task = build("associative-recall")
    batch = task.sample(100, step_generator(CPU, 5))
    items = batch.inputs[:, :, 4].sum(1).long()  # one item delimiter per item
    assert torch.equal(batch.groups, items - 2)
    assert task.group_label(0) == "2 items" and task.num_groups == 5


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_loss_and_bit_errors(name: str) -> None:
    task = build(name)
    batch = task.sample(32, step_generator(CPU, 2))
    scored = batch.mask.sum(1)  # [B]
    zeros = torch.zeros_like(batch.targets)
    loss = task.loss(zeros, batch)
    expected = math.log(2) * task.spec.output_size * scored.mean()
    torch.testing.assert_close(loss, expected)
    time_major = masked_sigmoid_cross_entropy(
        zeros.transpose(0, 1), batch.targets.transpose(0, 1), batch.mask.t()
    )
    torch.testing.assert_close(loss, time_major)
    right = batch.targets * 20 - 10
    assert task.metric.name == "bit_errors" and not task.metric.higher_is_better
    assert (task.measure(right, batch)["bit_errors"].total == 0).all()
    wrong = task.measure(-right, batch)["bit_errors"].total
    assert wrong.shape == (32,)
    torch.testing.assert_close(wrong, scored * task.spec.output_size)


def test_select_trims_padding() -> None:
    task = build("repeat-copy")
    batch = task.sample(32, step_generator(CPU, 2))
    short = torch.nonzero(batch.lengths == batch.lengths.min()).flatten()
    picked = batch.select(short)
    steps = int(batch.lengths.min())
    assert picked.inputs.shape[1] == steps and picked.mask.shape[1] == steps
    assert picked.targets.shape[1] == steps
    assert torch.equal(picked.inputs, batch.inputs[short, :steps])
    assert torch.equal(picked.groups, batch.groups[short])
    half = batch.select(slice(0, 16))
    assert isinstance(half, Batch) and half.inputs.shape[0] == 16


@pytest.mark.parametrize(
    ("cls", "field", "value", "message"),
    [
        (RepeatCopyConfig, "num_bits", 0, "task.num_bits must be >= 1, got 0"),
        (RepeatCopyConfig, "min_length", 3, "task.min_length (3) must be <= task.max_length (2)"),
        (RepeatCopyConfig, "max_repeats", 0, "task.max_repeats must be >= 1"),
        (RepeatCopyConfig, "norm_max", 0.0, "task.norm_max must be > 0"),
        (CopyConfig, "max_length", 0, "task.max_length must be >= 1"),
        (CopyConfig, "test_size", 0, "task.test_size must be >= 1"),
        (AssociativeRecallConfig, "min_items", 1, "task.min_items must be >= 2"),
        (AssociativeRecallConfig, "min_items", 7, "task.min_items (7) must be <= task.max_items"),
        (AssociativeRecallConfig, "item_length", 0, "task.item_length must be >= 1"),
    ],
)
def test_config_rejects_bad_values(cls: type, field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        cls(**{field: value})


def test_metric_directions() -> None:
    nan = float("nan")
    assert BIT_ERRORS.improves(1.0, 2.0) and not BIT_ERRORS.improves(3.0, 2.0)
    assert ACCURACY.improves(0.6, 0.5) and not ACCURACY.improves(0.4, 0.5)
    assert BIT_ERRORS.improves(7.0, nan) and not BIT_ERRORS.improves(nan, nan)
    assert ACCURACY.format(0.4998) == "49.98%" and BIT_ERRORS.format(0.03125) == "0.03125"
