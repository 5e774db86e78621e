"""Copy, repeat copy and associative recall: exact layouts, seeding, loss and metric."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from relmem.tasks import (
    AssociativeRecall,
    RepeatCopy,
    bit_errors,
    copy_task,
    masked_sigmoid_cross_entropy,
)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_repeat_copy_layout_matches_deepmind():
    task = RepeatCopy(num_bits=3, min_length=1, max_length=4, min_repeats=1, max_repeats=3)
    batch = task.sample(32, generator=gen())
    steps = batch.inputs.shape[0]
    assert batch.inputs.shape == (steps, 32, 5) and batch.targets.shape == (steps, 32, 4)
    assert batch.mask.shape == (steps, 32) and batch.lengths.dtype == torch.long
    assert steps == int(batch.lengths.max())
    for b in range(32):
        x, y, m = batch.inputs[:, b], batch.targets[:, b], batch.mask[:, b]
        total = int(batch.lengths[b])
        length = int(round(m.sum().item()))  # ℓk + 1 masked steps
        # recover ℓ and k from the layout: the repeat row holds k / 10
        repeat_row = int(x[:, 4].nonzero()[0])
        ell = repeat_row - 1
        k = int(round(x[repeat_row, 4].item() * 10))
        assert total == ell * (k + 1) + 3 and length == ell * k + 1
        assert x[0].tolist() == [0, 0, 0, 1, 0]
        pattern = x[1 : ell + 1, :3]
        assert (x[1 : ell + 1, 3:] == 0).all() and (x[repeat_row + 1 :] == 0).all()
        assert (y[: ell + 2] == 0).all() and (m[: ell + 2] == 0).all()
        torch.testing.assert_close(y[ell + 2 : ell + 2 + ell * k, :3], pattern.repeat(k, 1))
        assert (y[ell + 2 : ell + 2 + ell * k, 3] == 0).all()
        assert y[ell + 2 + ell * k].tolist() == [0, 0, 0, 1]
        assert (m[ell + 2 : total] == 1).all() and (m[total:] == 0).all()
        assert (x[total:] == 0).all() and (y[total:] == 0).all()


def test_repeat_copy_draws_every_length_and_repeat():
    task = RepeatCopy(num_bits=2, min_length=2, max_length=3, min_repeats=1, max_repeats=2)
    batch = task.sample(200, generator=gen(1))
    assert set(batch.lengths.tolist()) == {2 * 2 + 3, 2 * 3 + 3, 3 * 2 + 3, 3 * 3 + 3}
    assert task.max_steps == 3 * 3 + 3 and task.input_size == 4 and task.target_size == 3


def test_copy_is_repeat_copy_with_one_repeat():
    task = copy_task()
    assert (task.num_bits, task.min_length, task.max_length) == (8, 1, 20)
    batch = task.sample(16, generator=gen())
    masked = batch.mask.sum(0)  # ℓ + 1
    torch.testing.assert_close(batch.lengths.float(), 2 * (masked - 1) + 3)
    assert ((batch.inputs[..., 9] == 0.1) | (batch.inputs[..., 9] == 0)).all()


def test_associative_recall_layout():
    task = AssociativeRecall()
    batch = task.sample(64, generator=gen(2))
    assert batch.inputs.shape[-1] == 8 and batch.targets.shape[-1] == 6
    for b in range(64):
        x, y, m = batch.inputs[:, b], batch.targets[:, b], batch.mask[:, b]
        total = int(batch.lengths[b])
        delimiters = x[:, 6].nonzero().flatten().tolist()
        count = len(delimiters)
        assert 2 <= count <= 6 and delimiters == [4 * i for i in range(count)]
        assert total == 4 * count + 8
        items = [x[4 * i + 1 : 4 * i + 4, :6] for i in range(count)]
        assert x[4 * count, 7] == 1 and x[4 * count + 4, 7] == 1 and x[:, 7].sum() == 2
        query = x[4 * count + 1 : 4 * count + 4, :6]
        matches = [i for i in range(count - 1) if torch.equal(items[i], query)]
        assert matches, "the query is one of items 1..c-1"
        torch.testing.assert_close(y[4 * count + 5 : total], items[matches[0] + 1])
        assert (m[4 * count + 5 : total] == 1).all() and m.sum() == 3
        assert (x[4 * count + 5 :] == 0).all()


def test_seeded_and_device_dtype_layout_options():
    task = RepeatCopy()
    a = task.sample(8, generator=gen(5))
    b = task.sample(8, generator=gen(5))
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)
    c = task.sample(8, generator=gen(6))
    assert not torch.equal(a.inputs, c.inputs) or not torch.equal(a.lengths, c.lengths)
    bf = task.sample(8, generator=gen(5), batch_first=True, dtype=torch.float64, device="cpu")
    assert bf.inputs.dtype == torch.float64 and bf.mask.dtype == torch.float64
    torch.testing.assert_close(bf.inputs, a.inputs.transpose(0, 1).double())
    torch.testing.assert_close(bf.mask, a.mask.transpose(0, 1).double())


def test_loss_matches_deepmind_definition():
    task = RepeatCopy()
    batch = task.sample(4, generator=gen())
    logits = torch.randn_like(batch.targets)
    xent = F.binary_cross_entropy_with_logits(logits, batch.targets, reduction="none")
    per_seq = (xent.sum(-1) * batch.mask).sum(0)
    torch.testing.assert_close(
        masked_sigmoid_cross_entropy(logits, batch.targets, batch.mask), per_seq.sum() / 4
    )
    torch.testing.assert_close(
        masked_sigmoid_cross_entropy(logits, batch.targets, batch.mask, time_average=True),
        (per_seq / batch.mask.sum(0)).sum() / 4,
    )
    torch.testing.assert_close(
        masked_sigmoid_cross_entropy(
            logits.transpose(0, 1), batch.targets.transpose(0, 1), batch.mask.T, batch_first=True
        ),
        per_seq.sum() / 4,
    )


def test_bit_errors():
    targets = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]], [[1.0, 1.0]]])  # [T=3, B=1, 2]
    logits = torch.tensor([[[5.0, 1.0]], [[-1.0, -2.0]], [[-3.0, -3.0]]])
    mask = torch.tensor([[1.0], [1.0], [0.0]])
    assert bit_errors(logits, targets, mask).tolist() == [2.0]  # step 2 is unmasked
    # perfect logits give zero errors on a real batch
    batch = RepeatCopy().sample(8, generator=gen())
    perfect = (batch.targets * 2 - 1) * 10
    assert (bit_errors(perfect, batch.targets, batch.mask) == 0).all()
    assert (bit_errors(-perfect, batch.targets, batch.mask) == batch.mask.sum(0) * 5).all()


@pytest.mark.parametrize(
    "factory,message",
    [
        (lambda: RepeatCopy(num_bits=0), "num_bits must be an integer >= 1, got 0"),
        (lambda: RepeatCopy(min_length=3, max_length=2), "min_length = 3 must be <= max_length"),
        (lambda: RepeatCopy(min_repeats=2, max_repeats=1), "min_repeats = 2 must be <="),
        (lambda: RepeatCopy(norm_max=0), "norm_max must be > 0"),
        (lambda: AssociativeRecall(min_items=1), "min_items must be an integer >= 2"),
        (lambda: AssociativeRecall(min_items=5, max_items=3), "min_items = 5 must be <="),
        (lambda: RepeatCopy().sample(0), "batch_size must be an integer >= 1, got 0"),
    ],
)
def test_bad_options_raise_clear_errors(factory, message):
    with pytest.raises(ValueError, match=message):
        factory()


def test_loss_shape_errors():
    with pytest.raises(ValueError, match=r"expected logits and targets \[T, B, C\]"):
        masked_sigmoid_cross_entropy(torch.zeros(3, 2, 4), torch.zeros(3, 2, 5), torch.zeros(3, 2))
    with pytest.raises(ValueError, match="bit_errors: expected"):
        bit_errors(torch.zeros(3, 2, 4), torch.zeros(3, 2, 4), torch.zeros(2, 3))
