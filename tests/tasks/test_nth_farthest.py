"""The Nth Farthest generator against a brute-force reading of its own inputs
(``docs/tasks.md`` §1.1-§1.2)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from relmem.tasks.base import derive_seed, step_generator
from relmem.tasks.nth_farthest import NthFarthest, NthFarthestConfig, generate

CPU = torch.device("cpu")


def brute_force_reference(inputs: np.ndarray, k: int, f: int) -> tuple[int, int]:
    """Label and rank from one shuffled 'reference' sequence ``[K, F+3K]``, by loops."""
    x = {int(np.argmax(row[f : f + k])): row[:f].astype(np.float64) for row in inputs}
    ref = int(np.argmax(inputs[0, f + k : f + 2 * k]))
    nth = int(np.argmax(inputs[0, f + 2 * k :]))
    dists = [(float(np.sqrt(((x[i] - x[ref]) ** 2).sum())), i) for i in range(k)]
    dists.sort()  # ties broken by object id, like a stable argsort
    return dists[nth][1], nth


def brute_force_l0sg(inputs: np.ndarray, k: int, f: int) -> tuple[int, int]:
    """Label and rank from one 'l0sg' sequence (rows in sampling order), by loops."""
    labels = [int(np.argmax(row[f : f + k])) for row in inputs]
    n = int(np.argmax(inputs[0, f + k : f + 2 * k]))
    m = int(np.argmax(inputs[0, f + 2 * k :]))
    ref = labels.index(m)
    xs = inputs[:, :f].astype(np.float64)
    dists = sorted((float(np.linalg.norm(xs[i] - xs[ref])), i) for i in range(k))
    return labels[dists[k - 1 - n][1]], k - 1 - n


@pytest.mark.parametrize("convention", ["reference", "l0sg"])
@pytest.mark.parametrize(("k", "f"), [(8, 16), (4, 4), (3, 2)], ids=["K8F16", "K4F4", "K3F2"])
def test_labels_match_brute_force(convention: str, k: int, f: int) -> None:
    batch = generate(300, k, f, step_generator(CPU, 7, k, f), convention)
    assert batch.inputs.shape == (300, k, f + 3 * k)
    assert batch.inputs.dtype == torch.float32 and batch.targets.dtype == torch.int64
    oracle = brute_force_reference if convention == "reference" else brute_force_l0sg
    for inputs, target, group in zip(
        batch.inputs.numpy(), batch.targets, batch.groups, strict=True
    ):
        label, rank = oracle(inputs, k, f)
        assert int(target) == label
        assert int(group) == rank


def test_reference_encoding() -> None:
    k, f = 8, 16
    batch = generate(500, k, f, step_generator(CPU, 1), "reference")
    x = batch.inputs[..., :f]
    assert x.min() >= -1 and x.max() <= 1 and x.abs().mean() > 0.4  # U(-1, 1), not binary
    ids = batch.inputs[..., f : f + k].argmax(-1)
    assert torch.equal(ids.sort(dim=1).values, torch.arange(k).expand(500, k))  # one row each
    assert (ids != torch.arange(k)).any(dim=1).float().mean() > 0.9  # rows are shuffled
    for block in (slice(f + k, f + 2 * k), slice(f + 2 * k, None)):  # same on every row
        assert torch.equal(batch.inputs[:, :1, block].expand(-1, k, -1), batch.inputs[..., block])
    assert torch.equal(batch.groups, batch.inputs[:, 0, f + 2 * k :].argmax(-1))
    # nth = 0 asks for the reference itself.
    self_case = batch.groups == 0
    ref = batch.inputs[:, 0, f + k : f + 2 * k].argmax(-1)
    assert torch.equal(batch.targets[self_case], ref[self_case])


def test_not_the_pre_fix_label_rule() -> None:
    """Before Sonnet's fix the label was the rank of object nth, not the object at rank nth."""
    k, f = 8, 16
    batch = generate(400, k, f, step_generator(CPU, 3), "reference")
    x = {}
    old = []
    for inputs in batch.inputs.numpy():
        x = {int(np.argmax(r[f : f + k])): r[:f] for r in inputs}
        ref, nth = int(np.argmax(inputs[0, f + k : f + 2 * k])), int(np.argmax(inputs[0, -k:]))
        order = np.argsort([np.linalg.norm(x[i] - x[ref]) for i in range(k)], kind="stable")
        old.append(int(np.argsort(order, kind="stable")[nth]))
    assert (torch.tensor(old) != batch.targets).float().mean() > 0.5


def test_reproducible_and_seeded() -> None:
    a = generate(64, 8, 16, step_generator(CPU, 0, 1, 5))
    b = generate(64, 8, 16, step_generator(CPU, 0, 1, 5))
    c = generate(64, 8, 16, step_generator(CPU, 0, 1, 6))
    assert a.mask is None and a.lengths is None  # a last-step task: no mask, no padding
    assert all(torch.equal(s, t) for s, t in zip(a[:3], b[:3], strict=True))
    assert not torch.equal(a.inputs, c.inputs)
    assert derive_seed(0, 1, 5) != derive_seed(0, 5, 1)


def test_held_out_is_fixed_and_label_distribution() -> None:
    task = NthFarthest(NthFarthestConfig(num_objects=8, num_features=16, test_size=4000))
    a, b = task.held_out(CPU), task.held_out(CPU)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    counts = torch.bincount(a.targets, minlength=8).float() / 4000
    assert (counts - 1 / 8).abs().max() < 0.03  # labels are near uniform: chance is 1/K
    assert task.spec.input_size == 40 and task.spec.seq_len == 8 and task.spec.output_size == 8
    assert task.spec.output == "last" and not task.spec.per_step


@pytest.mark.parametrize(
    ("field", "value"), [("num_objects", 1), ("num_features", 0), ("convention", "x")]
)
def test_config_rejects_bad_values(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field if field != "convention" else "convention"):
        NthFarthestConfig(**{field: value})
