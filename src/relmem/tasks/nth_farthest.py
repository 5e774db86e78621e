"""The Nth Farthest task of Santoro et al. 2018 (``specs/tasks.md`` section 1).

Each sequence holds K vectors ``x_i ~ U(-1, 1)^F``. The model reads them one row per time step
and must name the object at a given rank of the distances from a reference object.

Two conventions (spec 1.2):

- ``'reference'`` (default): the Sonnet generator after its label fix. Object i's row is
  ``[x_i | onehot(i) | onehot(reference) | onehot(nth)]``; the rows are shuffled by a random
  permutation per sequence; the label is ``argsort(dist[reference], stable, ascending)[nth]``,
  so ``nth = 0`` is the reference itself and ``nth = K-1`` the farthest object.
- ``'l0sg'``: L0SG/relational-rnn-pytorch. Objects get a random permutation of labels, rows stay
  in sampling order, a row is ``[x_i | onehot(label_i) | onehot(n) | onehot(m)]`` with ``m`` the
  reference's label, and the target is the label of the object at position ``-(n+1)`` of the
  ascending order, so ``n = 0`` is the farthest.

For both, ``Batch.groups`` is the rank asked for in ascending order (0 = the reference itself,
K-1 = the farthest), so per-rank accuracies compare across conventions. A model that only
solves rank 0 scores 2/K (spec 1.5): the 25% plateau for K = 8.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from relmem.tasks.base import ACCURACY, Batch, TaskSpec, register_task, step_generator

Convention = Literal["reference", "l0sg"]


@dataclass
class NthFarthestConfig:
    """Nth Farthest generator settings.

    Attributes:
        num_objects: K, vectors per sequence (paper 8; the Sonnet example's reduced task 4).
        num_features: F, dimensions per vector (paper 16; Sonnet example 4).
        convention: 'reference' (Sonnet, default) or 'l0sg' (spec 1.2).
        test_size: sequences in the fixed held-out set (spec 1.4: 16,000).
        test_seed: seed of the held-out set; independent of the training seed.
    """

    num_objects: int = 8
    num_features: int = 16
    convention: Convention = "reference"
    test_size: int = 16000
    test_seed: int = 20180611

    def __post_init__(self) -> None:
        if self.num_objects < 2:
            raise ValueError(f"task.num_objects must be >= 2, got {self.num_objects}")
        if self.num_features < 1:
            raise ValueError(f"task.num_features must be >= 1, got {self.num_features}")
        if self.convention not in ("reference", "l0sg"):
            raise ValueError(
                f"task.convention must be 'reference' or 'l0sg', got {self.convention!r}"
            )
        if self.test_size < 1:
            raise ValueError(f"task.test_size must be >= 1, got {self.test_size}")


def _distance_dtype(device: torch.device) -> torch.dtype:
    # The reference computes distances in float64 (spec 1.1); MPS has no float64.
    return torch.float32 if device.type == "mps" else torch.float64


def generate(
    batch_size: int,
    num_objects: int,
    num_features: int,
    generator: torch.Generator,
    convention: Convention = "reference",
) -> Batch:
    """Draw ``batch_size`` Nth Farthest sequences on ``generator.device``.

    Args:
        batch_size: B.
        num_objects: K.
        num_features: F.
        generator: the source of randomness; its device is the output's device.
        convention: 'reference' or 'l0sg' (module docstring).

    Returns:
        :class:`Batch` with ``inputs [B, K, F + 3K]`` float32, ``targets [B]`` int64 in
        ``0..K-1`` and ``groups [B]`` int64, the ascending rank asked for.
    """
    b, k, f = batch_size, num_objects, num_features
    device = generator.device
    ints = {"device": device, "dtype": torch.int64}
    x = torch.rand(b, k, f, generator=generator, device=device) * 2 - 1  # [B, K, F]
    nth = torch.randint(0, k, (b,), generator=generator, **ints)  # [B]
    ref = torch.randint(0, k, (b,), generator=generator, **ints)  # [B] index into objects
    xd = x.to(_distance_dtype(device))
    ref_x = xd.gather(1, ref.view(b, 1, 1).expand(b, 1, f))  # [B, 1, F]
    dist = (xd - ref_x).square().sum(-1).sqrt()  # [B, K]
    order = torch.argsort(dist, dim=1, stable=True)  # [B, K] ascending
    arange = torch.arange(k, **ints)
    if convention == "reference":
        target = order.gather(1, nth.view(b, 1)).squeeze(1)  # object id at rank nth
        ids = arange.expand(b, k)  # [B, K]
        rows = torch.cat(
            [
                x,
                F.one_hot(ids, k).float(),
                F.one_hot(ref, k).float().unsqueeze(1).expand(b, k, k),
                F.one_hot(nth, k).float().unsqueeze(1).expand(b, k, k),
            ],
            dim=2,
        )  # [B, K, F + 3K]
        perm = torch.argsort(torch.rand(b, k, generator=generator, device=device), dim=1)
        rows = rows.gather(1, perm.unsqueeze(-1).expand_as(rows))  # shuffled rows
        return Batch(rows, target, nth)
    # 'l0sg': labels are a random permutation, rows stay in sampling order.
    labels = torch.argsort(torch.rand(b, k, generator=generator, device=device), dim=1)  # [B, K]
    n = nth  # n = 0 asks for the farthest
    m = labels.gather(1, ref.view(b, 1)).squeeze(1)  # the reference's label
    position = order.gather(1, (k - 1 - n).view(b, 1))  # object at ascending rank K-1-n
    target = labels.gather(1, position).squeeze(1)
    rows = torch.cat(
        [
            x,
            F.one_hot(labels, k).float(),
            F.one_hot(n, k).float().unsqueeze(1).expand(b, k, k),
            F.one_hot(m, k).float().unsqueeze(1).expand(b, k, k),
        ],
        dim=2,
    )
    return Batch(rows, target, k - 1 - n)


class NthFarthest:
    """The Nth Farthest task for the generic trainer (see :class:`relmem.tasks.base.Task`).

    Args:
        config: :class:`NthFarthestConfig`.
    """

    group_name = "rank (0 = the reference itself, K-1 = the farthest)"
    metric = ACCURACY

    def __init__(self, config: NthFarthestConfig) -> None:
        self.config = config
        k, f = config.num_objects, config.num_features
        self.spec = TaskSpec(input_size=f + 3 * k, seq_len=k, output_size=k)  # last-step
        self.num_groups = k

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        """A fresh batch: ``inputs [B, K, F+3K]``, ``targets [B]``, ``groups [B]``."""
        c = self.config
        return generate(batch_size, c.num_objects, c.num_features, generator, c.convention)

    def held_out(self, device: torch.device) -> Batch:
        """The fixed held-out set of ``test_size`` sequences drawn from ``test_seed``.

        It is drawn on the CPU and moved to ``device``, so it is bit-identical on every device.
        """
        generator = step_generator(torch.device("cpu"), self.config.test_seed)
        return self.sample(self.config.test_size, generator).to(device)

    def group_label(self, group: int) -> str:
        """``'rank r (paper n = K - r)'``: the paper counts n from 1 = the farthest."""
        return f"rank {group} (paper n = {self.config.num_objects - group})"

    def loss(self, logits: Tensor, batch: Batch) -> Tensor:
        """Softmax cross-entropy on ``logits [B, K]`` (spec 1.3), mean over the batch."""
        return F.cross_entropy(logits.float(), batch.targets)

    def metrics(self, logits: Tensor, batch: Batch) -> dict[str, Tensor]:
        """``{'accuracy': [B]}``: 1.0 where ``argmax(logits)`` is the label (spec 1.4)."""
        return {"accuracy": (logits.argmax(-1) == batch.targets).float()}


@register_task("nth-farthest", NthFarthestConfig, default_preset="nth_farthest_cpu")
def build_nth_farthest(config: NthFarthestConfig) -> NthFarthest:
    """Registry builder for ``relmem train nth-farthest``."""
    return NthFarthest(config)
