"""Metrics as sums and counts: the running :class:`Totals` and held-out :func:`evaluate`.

Every figure the trainer reports is ``Σ total / Σ count`` over the examples it covers
(:class:`~relmem.tasks.base.Measure`), summed in float64 and all-reduced over the processes
before the division, so a chunked, sharded or per-group evaluation gives exactly what one pass
over the whole set would (token-weighted metrics included).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import Tensor, nn
from tqdm import tqdm

from relmem.tasks.base import Batch, LazyRows, Measure, Task, row_chunks
from relmem.train.distributed import DistInfo, all_reduce_sum


def accumulator_dtype(device: torch.device) -> torch.dtype:
    """float64 for metric sums, except on MPS, which has no float64."""
    return torch.float32 if device.type == "mps" else torch.float64


def autocast(device: torch.device, enabled: bool) -> contextlib.AbstractContextManager[Any]:
    """bfloat16 autocast on ``device`` when ``enabled``, else a no-op."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


class Totals:
    """Running sums and counts of the loss, the primary metric and the task's extra metrics,
    and of the primary metric by group.

    Args:
        task: names the primary metric and the number of groups.
        device: where the sums live (the all-reduce needs them on the process's device).
    """

    def __init__(self, task: Task, device: torch.device) -> None:
        self.specs = (task.metric, *task.extra_metrics)
        self.names = ("loss", *(spec.name for spec in self.specs))
        dtype = accumulator_dtype(device)
        self.sums = torch.zeros(len(self.names), 2, dtype=dtype, device=device)  # [K, 2]
        self.by_group = torch.zeros(task.num_groups, 2, dtype=dtype, device=device)  # [G, 2]

    def add(self, measures: dict[str, Measure], groups: Tensor | None) -> None:
        """Add a batch's ``measures`` (each field ``[B]``); ``groups [B]`` or None."""
        for i, name in enumerate(self.names):
            total, count = measures[name]
            self.sums[i, 0] += total.detach().to(self.sums.dtype).sum()
            self.sums[i, 1] += count.detach().to(self.sums.dtype).sum()
        if groups is not None and self.by_group.numel():
            total, count = measures[self.names[1]]
            pairs = torch.stack([total.detach(), count.detach()], dim=1)  # [B, 2]
            self.by_group.index_add_(0, groups, pairs.to(self.by_group.dtype))

    def all_reduce(self, info: DistInfo) -> Totals:
        """Sum over the processes, in place."""
        all_reduce_sum(self.sums, info)
        all_reduce_sum(self.by_group, info)
        return self

    def means(self) -> dict[str, float]:
        """``{'loss': Σ total / Σ count, metric: ..., extra metrics: ...}`` (NaN where nothing
        was counted; metrics through :meth:`MetricSpec.of_ratio`, e.g. perplexity from the mean
        NLL)."""
        loss, *ratios = (self.sums[:, 0] / self.sums[:, 1]).tolist()
        values = [spec.of_ratio(r) for spec, r in zip(self.specs, ratios, strict=True)]
        return dict(zip(self.names, (loss, *values), strict=True))

    def group_means(self) -> dict[int, float]:
        """The primary metric of each group that has a count."""
        pairs = self.by_group.tolist()
        return {
            g: self.specs[0].of_ratio(total / count)
            for g, (total, count) in enumerate(pairs)
            if count > 0
        }

    def reset(self) -> None:
        """Back to zero (the start of a logging window)."""
        self.sums.zero_()
        self.by_group.zero_()


def forward_batch(
    model: nn.Module,
    task: Task,
    batch: Batch,
    totals: Totals,
    *,
    bf16: bool = False,
    predictions: dict[str, Any] | None = None,
) -> None:
    """Run ``model`` over ``batch`` from its initial state and add the measures to ``totals``
    (and, given a ``predictions`` dict, the task's official predictions of the same outputs:
    :meth:`~relmem.tasks.base.Task.predictions`).

    A stateful task's rows are walked in windows of ``task.spec.seq_len`` steps, the state
    carried from each window to the next; other tasks take the rows in one forward pass.
    """
    steps = batch.inputs.shape[1]
    width = task.spec.seq_len if task.stateful else steps
    state = None
    for start in range(0, steps, width):
        window = batch.window(start, start + width) if task.stateful else batch
        with autocast(batch.inputs.device, bf16):
            logits, state = model(window.inputs, state, lengths=window.lengths)
        totals.add(task.measure(logits, window), window.groups)
        if predictions is not None:
            predictions.update(task.predictions(logits, window) or {})


@torch.no_grad()
def evaluate(
    model: nn.Module,
    task: Task,
    batch: Batch | LazyRows,
    *,
    info: DistInfo | None = None,
    chunk: int = 4000,
    bf16: bool = False,
    progress: bool = False,
    predictions: bool = False,
) -> dict[str, Any]:
    """Loss and primary metric of ``model`` on ``batch``, sharded over ranks and summed.

    Rows are read in chunks of at most ``chunk`` sequences and, where they have lengths, at
    most :func:`~relmem.tasks.base.row_chunks`' token budget, each padded only to its own
    longest row, under ``no_grad`` (no autograd state is kept).

    Args:
        model: a sequence model, ``model(inputs, state, lengths=...) -> (logits, state)``;
            ``inputs [B, T, F]``, ``logits [B, C]`` or ``[B, T, O]``.
        task: supplies the measures (and, if stateful, the window length).
        batch: the *global* batch (or :class:`~relmem.tasks.base.LazyRows`); each rank
            evaluates its strided share of the rows.
        info: the process group.
        chunk: sequences per forward pass (a stateful task walks each chunk's rows in
            windows, its state carried across the whole split).
        bf16: bfloat16 autocast (CUDA).
        progress: show a progress bar on stderr once the evaluation has taken 2 s.
        predictions: also collect the task's official predictions of the same forward passes
            (this process's rows), under ``'predictions'`` (None for a task without them).

    Returns:
        ``{'loss', task.metric.name, extra metrics, 'count', 'groups': {group id: metric}}``:
        sums over counts over the batch and over each group (``count`` is the number of
        sequences); with ``predictions``, ``'predictions'`` too.
    """
    info = info or DistInfo()
    was_training = model.training
    model.eval()
    device = batch.device
    totals = Totals(task, device)
    rows = torch.arange(info.rank, batch.size, info.world_size, device=device)
    # a set of fewer rows than ranks leaves some ranks none: they add zeros to the sums
    parts = row_chunks(rows, batch.lengths, chunk) if rows.numel() else []
    answers: dict[str, Any] | None = {} if predictions else None
    bar = tqdm(total=rows.numel(), unit="seq", delay=2, disable=not progress, leave=False)
    for part in parts:
        forward_batch(model, task, batch.select(part), totals, bf16=bf16, predictions=answers)
        bar.update(part.numel())
    bar.close()
    totals.all_reduce(info)
    model.train(was_training)
    result = {**totals.means(), "count": batch.size, "groups": totals.group_means()}
    if predictions:
        result["predictions"] = answers or None
    return result
