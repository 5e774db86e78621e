"""A trained RL run read back: its task, its agent with a checkpoint's weights, its curves.

``relmem eval``, ``plot`` and ``play`` call these for a run of an RL task (one whose registry
entry names its own trainer) instead of the supervised model loader.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from relmem.models import HeadConfig
from relmem.tasks.registry import get_task
from relmem.train.config import TrainConfig
from relmem.train.metrics import series
from relmem.train.runs import MAX_PARAMETERS, load_run_config, load_trained


def is_rl_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` is a run of an RL task (its ``config.json`` names one whose
    registry entry has its own trainer).

    Raises:
        FileNotFoundError / ValueError / TypeError: as :func:`~relmem.train.runs.
        load_run_config`.
    """
    task_name, _ = load_run_config(run_dir)
    return get_task(task_name).trainer is not None


def agent_of(config: TrainConfig, task: Any) -> nn.Module:
    """The agent of ``config.model`` for the RL ``task`` (a :data:`~relmem.train.runs.
    ModelBuilder`: the size check and the loaders build RL runs' models with it).

    Raises:
        ValueError: ``--head.*`` was set: it shapes the supervised tasks' head, which an agent
            does not have (its heads are ``--task.agent.*``).
    """
    if config.head != HeadConfig():
        raise ValueError(
            f"head.hidden_sizes={list(config.head.hidden_sizes)}: --head.* shapes the "
            "supervised tasks' MLP head, and an RL agent has none; its policy and value heads "
            "are set by --task.agent.hidden-size (and its encoder by --task.agent.conv-channels, "
            "--task.agent.kernel-size)"
        )
    return task.agent(config.model, config.model_config())


def load_agent(
    run_dir: Path,
    checkpoint: Path | None = None,
    device: torch.device | str = "cpu",
    max_parameters: int = MAX_PARAMETERS,
) -> tuple[TrainConfig, str, Any, nn.Module, Path]:
    """Rebuild an RL run's task and agent and load a checkpoint's weights.

    Args:
        run_dir: the run directory.
        checkpoint: a checkpoint directory; None: the run's best on the validation levels
            (``checkpoints/best``), or for a run that has none, its latest (or the newest
            intact one, named on stderr).
        device: where to put the agent.
        max_parameters: refuse a larger agent.

    Returns:
        ``(config, task_name, task, agent in eval mode, checkpoint directory)``.
    """
    return load_trained(
        run_dir, checkpoint, device, max_parameters, build=agent_of, prefer_best=True
    )


def plot_curves(records: list[dict[str, Any]], path: Path, title: str, solvable: bool) -> None:
    """Episode return (and, for a solvable game, the share of levels solved) of the training
    episodes and of the evaluations on the validation levels, against steps (top) and minutes
    (middle); the updates' policy entropy and KL divergence (PPO) or gradient norm (IMPALA)
    against steps (bottom), where a policy that collapses shows first."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["return", "solved"] if solvable else ["return", "length"]
    labels = {"return": "episode return", "solved": "levels solved", "length": "episode length"}
    fig, axes = plt.subplots(3, 2, figsize=(12, 11), constrained_layout=True, squeeze=False)

    def draw(ax: Any, key: str, xkey: str, scale: float, label: str, marker: str | None) -> None:
        xs, ys = series(records, key, xkey, scale)
        if xs:
            ax.plot(xs, ys, label=label, marker=marker)

    for row, xkey, xlabel, scale in ((0, "step", "step", 1.0), (1, "time_s", "minutes", 60.0)):
        for col, name in enumerate(names):
            ax = axes[row][col]
            for prefix, label in (("train", "training episodes"), ("eval", "validation levels")):
                marker = "o" if prefix == "eval" else None
                draw(ax, f"{prefix}/{name}", xkey, scale, label, marker)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(labels[name])
    second = ("train/grad_norm", "gradient norm")
    if any("train/kl" in r for r in records):  # PPO
        second = ("train/kl", "KL(collecting ‖ updated)")
    for col, (key, label) in enumerate((("train/entropy", "policy entropy (nats)"), second)):
        draw(axes[2][col], key, "step", 1.0, "updates", None)
        axes[2][col].set_xlabel("step")
        axes[2][col].set_ylabel(label)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
