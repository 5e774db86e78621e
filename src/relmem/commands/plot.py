"""``relmem plot RUN_DIR``: learning curves and, for the RMC, attention heatmaps (PNG).

- ``curves.png``: held-out / training / best-batch values of the task's primary metric
  (accuracy, bit errors per sequence, ...) and losses against steps and against wall-clock
  time, from ``metrics.jsonl`` (never from TensorBoard).
- ``attention_example_{i}.png`` (a model whose core is the RMC, with a last-step head, as on
  Nth Farthest; skipped for other cores and heads): for one held-out sequence, one heatmap per head
  (columns) and time step (rows) of the first block's attention weights: query rows are the
  N memory slots and the input row, key columns the same N + 1 rows (paper section 5.1, Fig. 3).
- A run of an RL task (``boxworld``, ``minipacman``): ``curves.png`` holds the episode return
  and the share of levels solved (Mini PacMan: the episode length) of the training episodes and
  of the held-out evaluations (``relmem play`` draws the agent's episodes).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import torch
import tyro

from relmem.commands.errors import describe_error
from relmem.cores.rmc import RelationalMemory
from relmem.models import SequenceModel
from relmem.tasks.base import ACCURACY, MetricSpec, Task
from relmem.tasks.registry import get_task
from relmem.train.checkpoint import CheckpointError
from relmem.train.config import TrainConfig
from relmem.train.exported import is_exported
from relmem.train.metrics import MetricsFileError, read_metrics, series
from relmem.train.runs import MAX_PARAMETERS, load_run_config, load_trained


@dataclass
class PlotArgs:
    """Plot a run's learning curves and attention maps.

    Attributes:
        run_dir: the run directory written by ``relmem train``.
        out: output directory (None: ``RUN_DIR/plots``).
        examples: held-out sequences to draw attention maps for (RMC runs); 0 draws the
            curves alone and reads no checkpoint.
        block: which attention block to draw (0-based).
        checkpoint: the checkpoint whose attention maps are drawn instead of the run's latest
            (RMC runs of last-step tasks; an RL run refuses it).
        max_parameters: refuse to build a model larger than this.
    """

    run_dir: Annotated[Path, tyro.conf.Positional]
    out: Path | None = None
    examples: int = 3
    block: int = 0
    checkpoint: Path | None = None
    max_parameters: int = MAX_PARAMETERS


def plot_curves(
    records: list[dict[str, Any]],
    path: Path,
    title: str,
    levels: dict[str, float] | None = None,
    metric: MetricSpec = ACCURACY,
    extra: tuple[MetricSpec, ...] = (),
) -> None:
    """The metric and the loss against steps (top) and wall-clock minutes (bottom).

    ``levels`` are dashed reference values drawn across the metric panels (e.g. chance and the
    2/K plateau of Nth Farthest); ``metric`` is the task's primary metric; the held-out curves
    of the ``extra`` metrics share its panel.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8), constrained_layout=True)
    m = metric.name
    curves = [
        (f"train/{m}", "train batch", 0),
        (f"eval/{m}", "held-out", 0),
        (f"eval/best_batch_{m}", "best fresh batch", 0),
        ("train/loss", "train", 1),
        ("eval/loss", "held-out", 1),
        *((f"eval/{x.name}", f"held-out {x.description}", 0) for x in extra),
    ]
    for row, xkey, xlabel, scale in ((0, "step", "step", 1.0), (1, "time_s", "minutes", 60.0)):
        for key, label, col in curves:
            xs, ys = series(records, key, xkey, scale)
            if xs:
                axes[row][col].plot(xs, ys, label=label)
        for i, (label, value) in enumerate((levels or {}).items()):
            axes[row][0].axhline(value, color="grey", linestyle=("--", ":")[i % 2], label=label)
        axes[row][0].set_ylabel(metric.description)
        axes[row][1].set_ylabel("cross-entropy")
        for col in (0, 1):
            axes[row][col].set_xlabel(xlabel)
            axes[row][col].grid(alpha=0.3)
            axes[row][col].legend()
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)


@torch.no_grad()
def attention_maps(core: RelationalMemory, inputs: torch.Tensor, block: int) -> torch.Tensor:
    """Attention weights of one sequence at every step.

    Args:
        core: a trained model's RMC core.
        inputs: ``[T, F]`` one sequence.
        block: attention block index.

    Returns:
        ``[T, H, N+1, N+1]``: per step and head, queries (N slots, then the input row) against
        keys (the same rows).
    """
    cell = core.cell
    rows = inputs.unsqueeze(0)  # [1, T, F]
    state = cell.initial_state(1)
    maps = []
    for t in range(rows.shape[1]):
        step_rows = cell.check_step_input(rows[:, t])  # [1, 1, F]
        _, state, details = cell.step(step_rows, state)
        maps.append(details.attention[block][0])  # [H, R_q, N+1]
    return torch.stack(maps)


def plot_attention(maps: torch.Tensor, path: Path, title: str, row_names: list[str]) -> None:
    """A grid of heatmaps: time steps down, heads across. ``maps`` is ``[T, H, R_q, R_k]``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, heads, r_q, r_k = maps.shape
    keys = [f"m{i}" for i in range(r_k - 1)] + ["in"]
    queries = keys[: r_q - 1] + ["in"] if r_q == r_k else keys[:r_q]
    fig, axes = plt.subplots(
        steps,
        heads,
        figsize=(1.9 * heads + 1, 1.9 * steps + 0.8),
        squeeze=False,
        constrained_layout=True,
    )
    for t in range(steps):
        for h in range(heads):
            ax = axes[t][h]
            image = ax.imshow(maps[t, h].cpu().numpy(), vmin=0.0, vmax=1.0, cmap="viridis")
            ax.set_xticks(range(r_k), keys, fontsize=6)
            ax.set_yticks(range(r_q), queries, fontsize=6)
            if t == 0:
                ax.set_title(f"head {h}", fontsize=9)
            if h == 0:
                ax.set_ylabel(f"t={t}: {row_names[t]}", fontsize=8)
    fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str]) -> int:
    """Entry point of ``relmem plot``; writes PNGs and prints their paths."""
    try:
        args = tyro.cli(PlotArgs, args=argv, prog="relmem plot")
    except SystemExit as exc:  # tyro has printed help or a boxed error message
        return int(exc.code or 0)
    out = args.out or Path(args.run_dir) / "plots"
    draw: Callable[[], int]
    try:
        if args.examples < 0:
            raise ValueError(f"--examples must be >= 0, got {args.examples}")
        task_name, config = load_run_config(args.run_dir)
        entry = get_task(task_name)
        if entry.trainer is not None:
            if args.checkpoint is not None:
                raise ValueError(
                    "--checkpoint: an RL run's plot draws its curves from metrics.jsonl and "
                    "reads no weights; relmem play RUN_DIR --checkpoint CKPT renders episodes"
                )
            draw = partial(_plot_rl, args, out, task_name, config)
        else:
            task = entry.build(config.task)
            why = _no_maps(args, config, task)
            if why is None:
                config, task_name, task, model, ckpt = load_trained(
                    args.run_dir, args.checkpoint, max_parameters=args.max_parameters
                )
                trained: tuple[SequenceModel, Path] | None = (model, ckpt)
            else:  # the curves alone: no checkpoint is read
                if args.examples:
                    print(f"no attention maps: {why}")
                trained = None
            draw = partial(_plot_supervised, args, out, task_name, config, task, trained)
    except (ValueError, TypeError, KeyError, CheckpointError, OSError) as exc:
        return _error(describe_error(exc, "--checkpoint"))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        reason = "not a directory" if out.exists() else exc.strerror or str(exc)
        return _error(f"--out {out}: {reason}")
    try:
        return draw()
    except OSError as exc:  # a PNG that cannot be written: a read-only --out, a full disk
        where = describe_error(exc, "--checkpoint")
        return _error(f"{where} (writing the plots in {out}; choose another --out DIR)")


def _plot_supervised(
    args: PlotArgs,
    out: Path,
    task_name: str,
    config: TrainConfig,
    task: Task,
    trained: tuple[SequenceModel, Path] | None,
) -> int:
    """``curves.png`` from ``metrics.jsonl`` and, given ``trained`` (the model and its
    checkpoint directory), the attention maps; status 2 when the metrics cannot be read (the
    maps are drawn all the same)."""
    if is_exported(Path(args.run_dir)):  # its run keeps the metrics
        print("no learning curves: an exported model keeps no metrics.jsonl (its run does)")
        return 0 if trained is None else _attention(args, out, task, *trained)
    try:
        records = _records(Path(args.run_dir))
    except (OSError, MetricsFileError) as exc:  # the attention maps need no metrics
        curves_error: str | None = describe_error(exc, "--checkpoint")
    else:
        curves_error = None
        curves = out / "curves.png"
        title = f"{task_name} / {config.model} ({args.run_dir})"
        plot_curves(records, curves, title, task.plot_levels(), task.metric, task.extra_metrics)
        print(f"written {curves}")
    code = 0 if trained is None else _attention(args, out, task, *trained)
    if curves_error is not None:
        return _error(f"no learning curves: {curves_error}")
    return code


def _plot_rl(args: PlotArgs, out: Path, task_name: str, config: TrainConfig) -> int:
    """The return and solve-rate curves of an RL run."""
    from relmem.rl.runs import plot_curves as plot_rl_curves

    try:
        records = _records(Path(args.run_dir))
    except (OSError, MetricsFileError) as exc:
        return _error(describe_error(exc, "--checkpoint"))
    curves = out / "curves.png"
    title = f"{task_name} / {config.model} ({args.run_dir})"
    solvable = any("train/solved" in r or "eval/solved" in r for r in records)
    plot_rl_curves(records, curves, title, solvable)
    print(f"written {curves}")
    return 0


def _records(run_dir: Path) -> list[dict[str, Any]]:
    """The complete records of ``run_dir``'s ``metrics.jsonl``, at least one.

    Raises:
        OSError: the file cannot be read.
        MetricsFileError: it is damaged, or holds no complete record (there would be nothing
            to draw: an empty ``curves.png`` and status 0 said nothing was wrong).
    """
    path = run_dir / "metrics.jsonl"
    records = read_metrics(path)
    if not records:
        why = "its only line does not parse" if path.read_bytes().strip() else "it is empty"
        raise MetricsFileError(f"{path} holds no complete record to draw ({why})")
    return records


def _no_maps(args: PlotArgs, config: TrainConfig, task: Task) -> str | None:
    """Why no attention maps are drawn (then no checkpoint is read), or None."""
    if args.examples == 0:
        return "--examples 0"
    if config.model != "rmc":
        return f"model {config.model!r} has no attention"
    if task.spec.per_step:
        return "they are drawn for last-step tasks"
    return None


def _error(message: str) -> int:
    print(f"relmem plot: error: {message}", file=sys.stderr)
    return 2


def _attention(
    args: PlotArgs,
    out: Path,
    task: Task,
    model: SequenceModel,
    ckpt: Path,
) -> int:
    """Draw the attention maps of ``args.examples`` (>= 1) held-out sequences (RMC, last-step
    task: :func:`_no_maps`)."""
    core = model.core
    assert isinstance(core, RelationalMemory)
    if not 0 <= args.block < core.config.num_blocks:
        return _error(f"--block must be in 0..{core.config.num_blocks - 1}, got {args.block}")
    held_out = task.held_out(torch.device("cpu"))
    shown = held_out.select(torch.arange(min(args.examples, held_out.size)))
    logits, _ = model(shown.inputs)
    for i in range(shown.size):
        maps = attention_maps(core, shown.inputs[i], args.block)
        target, guess = int(shown.targets[i]), int(logits[i].argmax())
        group = "" if held_out.groups is None else f", {task.group_name.split(' (')[0]} "
        group += "" if held_out.groups is None else str(int(held_out.groups[i]))
        title = (
            f"held-out example {i}{group}\nlabel {target}, predicted {guess}\n"
            f"block {args.block}, {ckpt.name}"
        )
        rows = task.step_labels(shown.inputs[i])
        path = out / f"attention_example_{i}.png"
        plot_attention(maps, path, title, rows)
        print(f"written {path}")
    return 0
