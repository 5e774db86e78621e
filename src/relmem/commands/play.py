"""``relmem play RUN_DIR --episodes N --out FILE.gif``: episodes of a trained RL agent as a GIF
or a PNG strip.

The episodes are the run's test levels (episode ``i`` is the level ``relmem eval`` plays as its
``i``-th), played by its best weights on the validation levels (or its latest, for a run that
keeps none), drawn by :mod:`relmem.rl.render`: the whole board beside what the agent sees,
tinted by the RMC's attention over the observed cells when the core is the RMC.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import torch
import tyro

from relmem.commands.errors import describe_error
from relmem.tasks.registry import get_task
from relmem.train.checkpoint import CheckpointError
from relmem.train.runs import MAX_PARAMETERS, load_run_config

MAX_FPS = 50  # GIF delays are whole hundredths of a second: 2 is the shortest viewers keep
MAX_SCALE = 64  # pixels per cell: a 19 x 15 Mini PacMan frame is then about 2,500 x 1,000


@dataclass
class PlayArgs:
    """Render episodes of a trained RL agent.

    Attributes:
        run_dir: the run directory written by ``relmem train boxworld`` / ``minipacman``.
        episodes: how many test episodes, one after the other.
        out: a ``.gif`` (animated) or ``.png`` (a strip of frames); None: ``RUN_DIR/play.gif``.
        checkpoint: a checkpoint directory instead of the run's best (``checkpoints/best``) or,
            without one, its latest.
        greedy: take the most probable action instead of sampling it.
        seed: the levels' seed (None: the run's test levels, ``task.eval_seed``).
        fps: GIF frames per second, at most 50.
        scale: pixels per board cell, 1 to 64.
        max_parameters: refuse to build a model larger than this.
    """

    run_dir: Annotated[Path, tyro.conf.Positional]
    episodes: int = 1
    out: Path | None = None
    checkpoint: Path | None = None
    greedy: bool = False
    seed: int | None = None
    fps: float = 4.0
    scale: int = 16
    max_parameters: int = MAX_PARAMETERS


def main(argv: list[str]) -> int:
    """Entry point of ``relmem play``; writes the file and prints its path."""
    try:
        args = tyro.cli(PlayArgs, args=argv, prog="relmem play")
    except SystemExit as exc:  # tyro has printed help or a boxed error message
        return int(exc.code or 0)
    out = args.out or Path(args.run_dir) / "play.gif"
    try:
        if args.episodes < 1:
            raise ValueError(f"--episodes must be >= 1, got {args.episodes}")
        if not 0 < args.fps <= MAX_FPS:
            raise ValueError(
                f"--fps must lie in (0, {MAX_FPS}] (a GIF's frame delay is a whole number of "
                f"hundredths of a second, and viewers slow shorter ones), got {args.fps}"
            )
        if not 1 <= args.scale <= MAX_SCALE:
            raise ValueError(
                f"--scale must lie in 1..{MAX_SCALE} pixels per cell, got {args.scale}"
            )
        if args.seed is not None and not 0 <= args.seed < 2**63:
            raise ValueError(f"--seed must lie in 0..2**63-1, got {args.seed}")
        if out.suffix.lower() not in (".gif", ".png"):
            raise ValueError(f"--out must end in .gif or .png, got {out}")
        _check_writable(out)
        task_name, _ = load_run_config(args.run_dir)
        if get_task(task_name).trainer is None:
            raise ValueError(
                f"{args.run_dir} is a run of {task_name!r}; relmem play renders the episodes "
                "of RL runs (boxworld, minipacman)"
            )
        from relmem.rl.render import render_episodes, write_frames
        from relmem.rl.runs import load_agent

        config, task_name, task, agent, ckpt = load_agent(
            args.run_dir, args.checkpoint, max_parameters=args.max_parameters
        )
        seed = config.task.eval_seed if args.seed is None else args.seed
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            frames = render_episodes(
                task.game,
                agent,
                episodes=args.episodes,
                seed=seed,
                scale=args.scale,
                greedy=args.greedy,
                **task.options,
            )
    except (ValueError, TypeError, KeyError, CheckpointError, OSError) as exc:
        return _error(describe_error(exc, "--checkpoint"))
    try:
        write_frames(frames, out, fps=args.fps)
    except OSError as exc:
        return _error(f"--out {out}: {exc.strerror or exc}")
    print(
        f"{task_name} / {config.model}, checkpoint {ckpt}: {args.episodes} episode(s), "
        f"{len(frames)} frames; written {out}"
    )
    return 0


def _check_writable(out: Path) -> None:
    """Refuse an ``--out`` that cannot be written, before any episode is played (its folder is
    made if missing).

    Raises:
        ValueError: ``out`` is a directory, its parent is not one or cannot be written.
    """
    if out.is_dir():
        raise ValueError(f"--out {out} is a directory; give a file name ending in .gif or .png")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ValueError(f"--out {out}: a parent of it is a file, not a directory") from None
    except OSError as exc:
        raise ValueError(f"--out {out}: cannot make its folder ({exc.strerror or exc})") from None
    if not os.access(out.parent, os.W_OK):
        raise ValueError(f"--out {out}: its folder {out.parent} is not writable")


def _error(message: str) -> int:
    print(f"relmem play: error: {message}", file=sys.stderr)
    return 2
