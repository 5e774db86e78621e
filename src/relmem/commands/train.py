"""``relmem train TASK [--preset NAME] [--resume RUN_DIR] [overrides]``.

The configuration is the preset (the task's CPU preset by default) or, with ``--resume``, the
run's own ``config.json``; tyro parses typed overrides on top (``--rmc.mem-slots 8``,
``--optim.lr 3e-4``, ``--steps 50000``). The same command runs data-parallel under ``torchrun``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import tyro

from relmem.commands.errors import describe_error
from relmem.tasks.registry import default_preset, get_preset, get_task, list_presets, list_tasks
from relmem.train.checkpoint import CHECKPOINT_DIR, CheckpointError, resolve_checkpoint
from relmem.train.config import TrainConfig, config_to_dict, fixed_difference
from relmem.train.lock import RunLockedError, check_unlocked
from relmem.train.loop import run
from relmem.train.runs import MAX_PARAMETERS, load_run_config, never_checkpointed

USAGE = """usage: relmem train TASK [--preset NAME] [--resume RUN_DIR] [OVERRIDES...]

tasks: {tasks}
Run `relmem train TASK --help` for the options of a task."""


def _error(exc: BaseException) -> int:
    """Print ``exc`` as the one line of a failed ``relmem train``; exit status 2."""
    print(f"relmem train: error: {describe_error(exc, '--resume')}", file=sys.stderr)
    return 2


def parse(argv: list[str]) -> tuple[str, TrainConfig, int]:
    """``(task_name, config, max_parameters)`` from ``TASK [--preset P] [--resume R]
    [--max-parameters N] [overrides]``; the trainer refuses a model over ``max_parameters``.

    Raises:
        SystemExit: from tyro, on --help or malformed overrides.
        KeyError / ValueError / CheckpointError / FileNotFoundError: on bad values.
    """
    task_name, rest = argv[0], argv[1:]
    entry = get_task(task_name)
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--preset")
    pre.add_argument("--resume")
    pre.add_argument("--max-parameters", type=int, default=MAX_PARAMETERS)
    known, rest = pre.parse_known_args(rest)
    if known.resume is not None:
        if known.preset is not None:
            raise ValueError("--preset and --resume exclude each other: a run keeps its config")
        given = Path(known.resume)  # a run directory or one of its checkpoints
        if given.is_file():  # its checkpoints/latest, or a mistake (named)
            given = resolve_checkpoint(given)
        # a run in training changes under its readers: refuse clearly before reading it
        check_unlocked(given.parent.parent if given.parent.name == CHECKPOINT_DIR else given)
        if never_checkpointed(given):  # killed before its first: the trainer starts it over
            resume = given
            run_task, default = load_run_config(given)
        else:
            resume = resolve_checkpoint(given)
            run_task, default = load_run_config(resume.parent.parent)
        if run_task != task_name:
            raise ValueError(
                f"--resume {known.resume} is a run of {run_task!r}, not {task_name!r}; "
                f"continue it with `relmem train {run_task} --resume {known.resume}`"
            )
        default.resume = resume
    else:
        default = get_preset(task_name, known.preset or default_preset(task_name).name)
    presets = ", ".join(f"{p.name} ({p.library_name})" for p in list_presets(task_name))
    config = tyro.cli(
        TrainConfig[entry.config_cls],
        args=rest,
        default=default,
        prog=f"relmem train {task_name}",
        description=(
            f"Train a model on {task_name}. --preset NAME picks the base config ({presets}; "
            f"default: {default_preset(task_name).name}); --resume RUN_DIR continues a run "
            "with its own config; --max-parameters N refuses larger models (default "
            f"{MAX_PARAMETERS:,}). The options below override either; the docs/PAGE.md §N they "
            "cite: `relmem docs PAGE N`."
        ),
    )
    if known.resume is not None:
        refuse_fixed_overrides(default, config)
    return task_name, config, known.max_parameters


def refuse_fixed_overrides(run: TrainConfig, given: TrainConfig) -> None:
    """Refuse overrides that a resumed run cannot take: a new place (``--out-dir``,
    ``--run-name``: the run stays where it is) or another model (``--model``, the model's own
    ``--rmc.*`` / ``--lstm.*`` / ..., ``--head.*``: the checkpoint's weights have the run's
    shapes).

    Raises:
        ValueError: naming the first such option, the run's value and what to do instead.
    """
    difference = fixed_difference(config_to_dict(run), config_to_dict(given))
    if difference is not None:
        option, before, after = difference
        raise ValueError(
            f"--{option.replace('_', '-')} cannot change when resuming (the run has "
            f"{before!r}, given {after!r}): a resumed run keeps its directory and its model; "
            "start a new run (with --preset, without --resume) to change it"
        )


def main(argv: list[str]) -> int:
    """Entry point of ``relmem train``; returns the exit status."""
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE.format(tasks=", ".join(list_tasks())))
        return 0 if argv else 2
    try:
        task_name, config, max_parameters = parse(argv)
    except SystemExit as exc:  # tyro has printed help or a boxed error message
        return int(exc.code or 0)
    except (
        KeyError,
        ValueError,
        TypeError,
        CheckpointError,
        OSError,
        RunLockedError,
    ) as exc:
        return _error(exc)
    try:
        argv = ["relmem", "train", *argv]
        result = run(config, task_name, argv=argv, max_parameters=max_parameters)
    except (ValueError, CheckpointError, FileExistsError, RunLockedError, OSError) as exc:
        return _error(exc)
    return result.exit_code
