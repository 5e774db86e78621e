"""The contract every training task implements.

A task is a :class:`Task` built from its config dataclass. The trainer only ever calls the
methods below, so a new task (copy, Learning to Execute, language modelling, ...) joins by
subclassing :class:`Task` and registering a builder (:mod:`relmem.tasks.registry`). Its
:class:`TaskSpec` tells the model builder the shapes, the input encoding and the head; its
:class:`MetricSpec` names the metric the trainer reports.

- **Data** is a pure function of ``(seed, step)``: :func:`step_generator` derives a fresh
  ``torch.Generator`` for every step, and :meth:`Task.sample` also receives the step, so a
  curriculum (a distribution that moves with training) lives in its task and a resumed run sees
  exactly the batches an uninterrupted one would.
- **Metrics** are sums and counts (:class:`Measure`): :meth:`Task.measure` returns, per example,
  the sum of a quantity and its weight, so the trainer reduces any metric exactly across
  batches, chunks, groups and processes (token-weighted perplexity: the row's summed NLL over
  its token count). The loss the trainer back-propagates is ``total.sum() / count.sum()`` of
  ``measure(...)['loss']``.
- **Stateful** tasks (``stateful = True``: a stream cut into windows of ``spec.seq_len`` steps)
  get the model's recurrent state carried from one batch to the next, detached at each boundary
  (truncated back-propagation through time); window ``step`` of a row continues window
  ``step - 1`` of the same row. Their held-out set is one long :class:`Batch` that evaluation
  walks in windows, carrying the state across the whole split.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from relmem.models.heads import get_head
from relmem.models.registry import architecture_reads, get_model
from relmem.models.spec import TaskSpec

__all__ = [
    "ACCURACY",
    "BIT_ERRORS",
    "PERPLEXITY",
    "Batch",
    "Measure",
    "MetricSpec",
    "Task",
    "TaskSpec",
    "derive_seed",
    "step_generator",
]

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def derive_seed(*keys: int) -> int:
    """Mix integer keys (seed, stream, step, ...) into one 63-bit seed, SplitMix64-style."""
    h = 0
    for key in keys:
        h = _splitmix64(h ^ (int(key) & _MASK64))
    return h >> 1


def step_generator(device: torch.device, *keys: int) -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded from :func:`derive_seed` of ``keys``."""
    generator = torch.Generator(device=device)
    generator.manual_seed(derive_seed(*keys))
    return generator


class Batch(NamedTuple):
    """One batch of a task, batch-first (every field's first axis is the batch).

    A last-step task (sequence classification, ``TaskSpec.output == 'last'``) fills the first
    three fields; a per-step task (copy, repeat copy, ...) also gives ``mask`` and ``lengths``.

    Attributes:
        inputs: ``[B, T, F]`` float32 model inputs (``[B, T]`` int64 ids for token encodings).
        targets: ``[B]`` int64 class labels (last-step tasks) or ``[B, T, O]`` per-step
            targets.
        groups: ``[B]`` int64 group ids in ``0..num_groups-1`` for per-group metrics (Nth
            Farthest: the rank of the asked-for object in the reference's ascending distance
            order), or None.
        mask: ``[B, T]`` float, 1 on the steps that are scored (per-step tasks), or None.
        lengths: ``[B]`` int64 valid lengths of right-padded sequences, or None (all T valid).
    """

    inputs: Tensor
    targets: Tensor
    groups: Tensor | None = None
    mask: Tensor | None = None
    lengths: Tensor | None = None

    @property
    def size(self) -> int:
        """B, the number of sequences (rows)."""
        return self.inputs.shape[0]

    def select(self, rows: Tensor | slice) -> Batch:
        """The examples ``rows`` of every field, with padding beyond their longest one removed.

        Trimming padded steps changes no result (they are unscored and leave the models'
        states alone) and saves their compute.
        """
        picked = Batch(*(None if t is None else t[rows] for t in self))
        if picked.lengths is None:
            return picked
        return picked.window(0, int(picked.lengths.max()))

    def window(self, start: int, stop: int) -> Batch:
        """Steps ``start..stop-1`` of every per-step field (``lengths`` clipped to the window).

        Used to walk a stateful task's long held-out rows in windows of ``spec.seq_len``.
        """

        def steps(t: Tensor | None) -> Tensor | None:
            return t[:, start:stop] if t is not None and t.dim() > 1 else t

        lengths = None if self.lengths is None else (self.lengths - start).clamp(0, stop - start)
        return Batch(
            steps(self.inputs), steps(self.targets), self.groups, steps(self.mask), lengths
        )

    def to(self, device: torch.device) -> Batch:
        """Every field moved to ``device``."""
        return Batch(*(None if t is None else t.to(device) for t in self))

    @property
    def device(self) -> torch.device:
        return self.inputs.device


class LazyRows:
    """A held-out set whose padded inputs are built a chunk of rows at a time.

    Padding every row of a reading task's held-out set to its longest context costs rows ×
    longest tokens (a 2 MB context asked 7.9 GB); the evaluation only ever needs a chunk of
    similar lengths at once. Behaves as a :class:`Batch` for :func:`row_chunks` and
    ``evaluate``: its cheap per-row fields are whole, :meth:`select` builds a chunk.

    Args:
        targets: ``[B, ...]`` per-row targets. groups: ``[B]`` or None. lengths: ``[B]`` valid
            lengths (what a chunk pads to).
        build: ``build(rows) -> Batch``, the rows ``rows`` padded to their longest.
    """

    def __init__(
        self,
        targets: Tensor,
        groups: Tensor | None,
        lengths: Tensor,
        build: Callable[[Tensor], Batch],
    ) -> None:
        self.targets, self.groups, self.lengths = targets, groups, lengths
        self._build = build

    @property
    def size(self) -> int:
        return self.targets.shape[0]

    @property
    def device(self) -> torch.device:
        return self.targets.device

    def select(self, rows: Tensor) -> Batch:
        """The rows ``rows [k]`` as a :class:`Batch` padded to their longest."""
        return self._build(rows)


def row_chunks(
    rows: Tensor, lengths: Tensor | None, max_rows: int, max_tokens: int = 1 << 17
) -> list[Tensor]:
    """Cut ``rows`` (in order) into chunks of at most ``max_rows`` rows and, where rows have
    ``lengths``, at most ``max_tokens`` padded tokens (rows × their longest length; a row
    longer than that is a chunk of its own). Sorted by length, rows pad little.

    Args:
        rows: ``[k]`` row indices. lengths: ``[B]`` every row's length, or None.

    Returns:
        The chunks, ``[k_i]`` each, in order.
    """
    if lengths is None:
        return list(rows.split(max_rows))
    chunks, start, longest = [], 0, 0
    sizes = lengths[rows].tolist()
    for i, size in enumerate(sizes):
        grown = max(longest, int(size))
        if i > start and (i - start >= max_rows or (i - start + 1) * grown > max_tokens):
            chunks.append(rows[start:i])
            start, grown = i, int(size)
        longest = grown
    if len(sizes) > start:
        chunks.append(rows[start:])
    return chunks


class Measure(NamedTuple):
    """A metric as per-example sums and weights; its value over any set of rows is
    ``total.sum() / count.sum()``.

    Attributes:
        total: ``[B]`` float, the summed quantity of each example (its loss, wrong bits,
            correct predictions, summed token NLL, ...).
        count: ``[B]`` float, what ``total`` is a sum over (1 per sequence for per-sequence
            means; the number of scored tokens for token-weighted ones).
    """

    total: Tensor
    count: Tensor

    @staticmethod
    def per_example(values: Tensor) -> Measure:
        """A per-sequence mean: ``total = values [B]``, ``count = 1``."""
        return Measure(values, torch.ones_like(values))

    def value(self) -> Tensor:
        """The scalar ``total.sum() / count.sum()``."""
        return self.total.sum() / self.count.sum()


@dataclass(frozen=True)
class MetricSpec:
    """A task's primary metric, a key of :meth:`Task.measure`.

    The trainer shows it in the progress bar and the summary, breaks it down by group and keeps
    its best value on fresh batches.

    Attributes:
        name: the key (``'accuracy'``); the trainer logs ``train/{name}``, ``eval/{name}``,
            ``eval/best_batch_{name}`` and writes ``held_out_{name}`` to ``summary.json``.
        higher_is_better: the direction ("best batch" is the maximum or the minimum).
        description: a readable name for tables and plots (``'bit errors per sequence'``).
        short: a few letters for the progress bar (``'acc'``).
        percent: show values as percentages.
        exponentiate: the metric is ``exp(Σ total / Σ count)`` (perplexity from summed
            negative log-likelihoods) rather than the ratio itself.
    """

    name: str
    higher_is_better: bool
    description: str
    short: str
    percent: bool = False
    exponentiate: bool = False

    def of_ratio(self, ratio: float) -> float:
        """The metric's value for ``Σ total / Σ count = ratio`` (its exp, if ``exponentiate``;
        ``inf`` past float range; NaN stays NaN)."""
        if not self.exponentiate or math.isnan(ratio):
            return ratio
        return math.exp(ratio) if ratio < 709.0 else math.inf

    def format(self, value: float) -> str:
        """``'49.98%'`` for a percentage metric, ``'0.0312'`` otherwise."""
        return f"{100 * value:.2f}%" if self.percent else f"{value:.4g}"

    def improves(self, value: float, best: float) -> bool:
        """Whether ``value`` beats ``best`` (a NaN ``best`` means no value yet)."""
        if math.isnan(best):
            return not math.isnan(value)
        return value > best if self.higher_is_better else value < best


ACCURACY = MetricSpec("accuracy", True, "accuracy", "acc", percent=True)
BIT_ERRORS = MetricSpec("bit_errors", False, "bit errors per sequence", "bits")
PERPLEXITY = MetricSpec("perplexity", False, "perplexity", "ppl", exponentiate=True)


class Task(ABC):
    """A task the generic trainer can run.

    Subclasses set ``spec`` and ``metric`` (usually in ``__init__``) and implement
    :meth:`sample`, :meth:`held_out` and :meth:`measure`; the rest has defaults.

    Attributes:
        spec: what the models need: sizes, input encoding and head.
        metric: the primary metric (a key of :meth:`measure`) and its direction.
        stateful: carry the model's state across batches (and across the held-out windows),
            detached at each boundary.
        group_name: what ``Batch.groups`` means, for eval tables.
        num_groups: the group ids lie in ``0..num_groups-1`` (0: the task has no groups).
        extra_metrics: further keys of :meth:`measure` the trainer reports beside the primary
            one (``train/{name}``, ``eval/{name}``, ``held_out_{name}``).
        keep_best: keep a copy of the weights with the best held-out metric
            (``checkpoints/best``), which ``relmem eval`` and ``relmem generate`` then use.
        fresh_batches: :meth:`sample_evaluation` draws batches the model has not trained on,
            so that each evaluation also scores one (``eval/batch_{metric}`` and the best of
            them, the paper's figure for Nth Farthest). False for a task whose batches are its
            training data in order (a corpus's windows): no such figure is made.
    """

    spec: TaskSpec
    metric: MetricSpec
    stateful: bool = False
    keep_best: bool = False
    fresh_batches: bool = True
    group_name: str = "group"
    num_groups: int = 0
    extra_metrics: tuple[MetricSpec, ...] = ()

    @abstractmethod
    def sample(self, batch_size: int, generator: torch.Generator, step: int = 0) -> Batch:
        """The batch of training step ``step``, drawn on ``generator.device``.

        Args:
            batch_size: B, the global batch (the trainer gives each process its slice).
            generator: fresh for this step, seeded from ``(seed, stream, step)``.
            step: optimiser steps taken so far; a curriculum reads it, a stateful task's rows
                continue from window ``step - 1``.
        """

    def sample_evaluation(
        self, batch_size: int, generator: torch.Generator, step: int = 0
    ) -> Batch:
        """The fresh batch of an evaluation (the paper-style best-batch figure), drawn like
        :meth:`sample`'s; a task whose training batches follow a curriculum draws it where the
        paper evaluates instead."""
        return self.sample(batch_size, generator, step)

    @abstractmethod
    def held_out(self, device: torch.device) -> Batch | LazyRows:
        """The fixed held-out set (the same on every call, rank and machine).

        A stateful task's rows are ``W·seq_len`` steps long; evaluation walks them in windows.
        A set of rows of very different lengths may come as :class:`LazyRows`, padded a chunk
        at a time.
        """

    @abstractmethod
    def measure(self, logits: Tensor, batch: Batch) -> dict[str, Measure]:
        """Per-example sums and weights of ``'loss'`` and of the primary metric.

        Args:
            logits: ``[B, C]`` (``spec.output == 'last'``) or ``[B, T, O]`` (per step).
            batch: the batch the logits were computed on.

        Returns:
            ``{'loss': Measure, metric.name: Measure, ...}``, every field ``[B]``.
        """

    def more_held_out(self, device: torch.device) -> dict[str, Batch | LazyRows]:
        """Further fixed sets that ``relmem eval`` reports beside :meth:`held_out`, by name
        (a language model's test split); none by default."""
        return {}

    def loss(self, logits: Tensor, batch: Batch) -> Tensor:
        """The training objective, the scalar ``measure(logits, batch)['loss'].value()``."""
        return self.measure(logits, batch)["loss"].value()

    def group_label(self, group: int) -> str:
        """A readable name for a value of ``Batch.groups`` (eval tables)."""
        return f"{self.group_name} {group}"

    def step_labels(self, inputs: Tensor) -> list[str]:
        """A name for each step of one sequence ``inputs [T, F]`` (attention plots' rows)."""
        return [f"row {t}" for t in range(inputs.shape[0])]

    def after_evaluation(self, metrics: dict[str, float]) -> dict[str, float]:
        """Called by the trainer after every held-out evaluation, on every process, with its
        metrics (``eval/loss``, ``eval/{metric}``, ...); returns metrics to log beside them.

        A curriculum moves here; whatever it changes belongs in :meth:`state_dict`.
        """
        return {}

    def state_dict(self) -> dict[str, Any]:
        """The task's mutable state (a curriculum's level), saved in checkpoints: plain
        numbers, strings, lists and dicts. Stateless tasks return ``{}``."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output when a run resumes.

        Raises:
            ValueError: a task without state is given some.
        """
        if state:
            raise ValueError(f"{type(self).__name__} keeps no state; got keys {sorted(state)}")

    def unused_options(self, model: str) -> dict[str, str]:
        """The training config's model options that this task's model, with the core
        ``model``, never reads, each with why: a section (``'head'``) or one option of the
        core's section (``'dnc.num_write_heads'``). ``relmem train`` refuses a value other than
        the default for them, which would be accepted and change nothing.

        By default: ``head`` unless the model is ``encoder -> core -> head`` with a head that
        reads it (``register_head(..., reads_config=True)``: the MLPs), and the options of the
        core's section that an architecture building the core itself does not read
        (``register_architecture(..., reads=...)``).
        """
        spec, unused = self.spec, {}
        if spec.architecture is not None or not get_head(spec.output).reads_config:
            built = f" of the {spec.architecture} architecture" if spec.architecture else ""
            unused["head"] = (
                f"this task's model has no MLP head (its output is the {spec.output!r} head{built})"
            )
        declared = (
            None if spec.architecture is None else architecture_reads(spec.architecture, model)
        )
        if declared is not None:
            reads, reason = declared
            shown = ", ".join(f"--{model}.{name.replace('_', '-')}" for name in reads)
            why = f"the {spec.architecture} reads only {shown} of --model {model} ({reason})"
            for option in dataclasses.fields(get_model(model).config_cls):
                if option.name not in reads:
                    unused[f"{model}.{option.name}"] = why
        return unused

    def data_identity(self) -> dict[str, Any]:
        """What trained weights depend on beyond the config, as JSON values: a corpus's
        vocabulary, through which ids mean words. A run records it in ``data.json`` when it
        starts; resuming, evaluating or generating from the run refuses data whose identity
        differs (the weights would load and read other words). ``{}`` (the default, a task
        that draws its data from the config alone) records nothing."""
        return {}

    def export_vocabulary(self) -> list[str] | dict[str, list[str]] | None:
        """The vocabulary to ship with the weights: the tokens of a task whose inputs are
        token ids, in id order (token ``i`` is id ``i``), or several such lists by name (words
        and characters); None (the default) for a task that reads no tokens. ``relmem export``
        writes it to ``vocab.json`` and :func:`relmem.load_pretrained` returns it, so that the
        model can be used without the task's data."""
        return None

    def predictions(self, logits: Tensor, batch: Batch) -> dict[str, Any] | None:
        """The model's outputs ``logits`` on ``batch`` in the task's official predictions
        format (a reading task's ``{question id: answer text}``), which ``relmem eval`` collects
        from its one pass over the held-out rows (``evaluate(..., predictions=True)``) and
        writes beside its record (``eval-predictions-held-out.json``); None (the default): the
        task has no such format."""
        return None

    def report(self, predictions: dict[str, Any], batch: Batch) -> dict[str, dict[str, float]]:
        """The official figures of :meth:`predictions`' output on ``batch``, overall
        (``'all'``) and by group label, each ``{figure: value}``, for ``relmem eval``."""
        raise NotImplementedError(f"{type(self).__name__} makes no predictions")

    def breakdown(self, device: torch.device) -> Batch | None:
        """A fixed set spanning the task's difficulty levels, with ``groups``, that
        ``relmem eval`` also reports group by group (None: the held-out set's groups are the
        breakdown)."""
        return None

    def plot_levels(self) -> dict[str, float]:
        """Reference values of the primary metric for plots (``{'chance 1/K = 25.0%': 0.25}``)."""
        return {}
