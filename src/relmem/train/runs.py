"""Run directories: creating and recording them, reading their config and model back.

A run directory holds ``config.json`` (the resolved :class:`TrainConfig` and the task's name),
``run.json`` (one record per invocation: command line, versions, git SHA, device),
``data.json`` (what the weights depend on beyond the config, such as a corpus's vocabulary;
only for tasks that have such data), ``metrics.jsonl``, ``tb/``, ``checkpoints/`` and
``summary.json``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import relmem.models as models
from relmem._version import __version__
from relmem.env_info import device_name, git_sha
from relmem.files import FileRefused, MiB, read_json
from relmem.tasks.base import Task
from relmem.tasks.registry import get_task
from relmem.train import checkpoint as ckpt_io
from relmem.train import exported
from relmem.train.config import TrainConfig, config_from_dict, config_to_dict, fixed_difference
from relmem.train.distributed import DistInfo
from relmem.train.lock import LOCK_FILE

# The most parameters a command builds unless --max-parameters lifts it (2^28 float32 weights are
# 1 GiB, Adam's moments twice that): a config.json from elsewhere cannot ask for any allocation.
MAX_STATE_ELEMENTS = 1 << 28  # one example's recurrent state and per-step attention (1 GiB f32)
MAX_PARAMETERS = 2**28

DATA_FILE = "data.json"  # the task's data identity (Task.data_identity) when the run started
SUMMARY_FILE = "summary.json"  # how the run ended: its status, steps and last held-out figures
MAX_RUN_JSON_BYTES = 16 * MiB  # config.json, data.json: a few kilobytes when written
MAX_RUN_RECORD_BYTES = 64 * MiB  # run.json: under a kilobyte per invocation


ModelBuilder = Callable[[TrainConfig, Task], nn.Module]


def check_model_size(
    config: TrainConfig,
    task: Task,
    max_parameters: int = MAX_PARAMETERS,
    build: ModelBuilder | None = None,
) -> int:
    """The parameter count of ``config``'s model for ``task``, counted on the ``meta`` device
    (nothing is allocated), once its recurrent state and largest per-step intermediate are
    within :data:`MAX_STATE_ELEMENTS` per example (:func:`state_elements`): a memory's size is
    not in its parameter count (a DNC of 2**20 slots has the parameters of one of 16, and a
    link matrix of 2**40 numbers per example; an RMC of 16,384 slots one width each, scores of
    2**28).

    Args:
        build: ``build(config, task) -> model`` (None: :func:`build_model`; an RL task's agent
            builder otherwise).

    Raises:
        ValueError: more than ``max_parameters``, a state over :data:`MAX_STATE_ELEMENTS`, or
            sizes too large to count (a tensor's size overflows, which the cores report as a
            ``MemoryError``); the message names the model's sizes and the bound.
    """
    try:
        with torch.device("meta"):
            model = (build or build_model)(config, task)
            state = state_elements(model)
    except (RuntimeError, OverflowError, TypeError, MemoryError) as exc:
        if not isinstance(exc, MemoryError) and "overflow" not in str(exc).lower():
            raise
        reason = str(exc).splitlines()[0].removesuffix("; choose smaller sizes")[:200]
        raise ValueError(
            f"model {config.model!r} as configured ({_sizes(config)}) is too large to build, far "
            f"past --max-parameters {max_parameters:,} ({reason}); choose smaller sizes"
        ) from None
    if state > MAX_STATE_ELEMENTS:
        raise ValueError(
            f"model {config.model!r} as configured ({_sizes(config)}) keeps {state:,} numbers "
            f"of recurrent state (and per-step attention) per example, more than the "
            f"{MAX_STATE_ELEMENTS:,} relmem builds (a memory that large would not fit in "
            "memory); choose smaller sizes"
        )
    count = models.count_parameters(model)
    if count > max_parameters:
        raise ValueError(
            f"model {config.model!r} as configured has {count:,} parameters, more than "
            f"--max-parameters {max_parameters:,}; pass a larger --max-parameters to build it"
        )
    return count


def _sizes(config: TrainConfig) -> str:
    """The integer options of ``config``'s model section, as command-line options."""
    return ", ".join(
        f"--{config.model}.{name.replace('_', '-')} {value}"
        for name, value in dataclasses.asdict(config.model_config()).items()
        if isinstance(value, int) and not isinstance(value, bool)
    )


def state_elements(model: nn.Module) -> int:
    """The numbers one example's recurrent state holds in ``model`` (built on the ``meta``
    device: nothing is allocated), with its largest per-step intermediate: the state of its
    outermost modules with an ``initial_state`` (the model, the core, each memory layer of the
    reader) plus the largest ``step_elements`` a module's config declares (an RMC's attention
    scores, :attr:`relmem.cores.rmc.RMCConfig.step_elements`)."""

    def numbers(state: Any) -> int:  # a tensor, or (named) tuples and lists of them
        if isinstance(state, torch.Tensor):
            return state.numel()
        return sum(map(numbers, state)) if isinstance(state, (tuple, list)) else 0

    def state(module: nn.Module) -> int:
        initial_state = getattr(module, "initial_state", None)
        if not callable(initial_state):
            return sum(state(child) for child in module.children())
        return numbers(initial_state(1, device=torch.device("meta")))

    steps = (getattr(getattr(m, "config", None), "step_elements", 0) for m in model.modules())
    return state(model) + max(steps, default=0)


def check_options_read(config: TrainConfig, task: Task) -> None:
    """Refuse a value other than the default for an option that ``config``'s model for
    ``task`` never reads (:meth:`~relmem.tasks.base.Task.unused_options`): given on the
    command line, it would be accepted and change nothing.

    Raises:
        ValueError: naming the first such option, its value and why it is not read.
    """
    for name, reason in task.unused_options(config.model).items():
        section, _, only = name.partition(".")
        given = getattr(config, section)
        default = type(given)()
        for option in dataclasses.fields(given):
            value = getattr(given, option.name)
            if (only or option.name) != option.name or value == getattr(default, option.name):
                continue
            shown = " ".join(map(str, value)) if isinstance(value, tuple) else value
            raise ValueError(
                f"--{section}.{option.name.replace('_', '-')} {shown}: {reason}, so the option "
                "would change nothing; leave it out"
            )


def build_model(config: TrainConfig, task: Task) -> nn.Module:
    """The registered model ``config.model`` for ``task``, on the CPU, seeded by ``seed``."""
    torch.manual_seed(config.seed)
    return models.build_model(config.model, config.model_config(), config.head, task.spec)


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON, atomically (a temporary file, then ``os.replace``, which
    replaces a symbolic link at ``path`` rather than writing where it points). Non-finite
    numbers are written as ``null`` (JSON has no NaN).

    Raises:
        OSError: naming ``path`` (the temporary file is removed).
    """
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(json.dumps(_finite(data), indent=2, allow_nan=False) + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror, str(path)) from exc


def _finite(data: Any) -> Any:
    """``data`` with every non-finite float replaced by None, containers walked."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {key: _finite(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(value) for value in data]
    return data


def new_run_dir(config: TrainConfig, task_name: str, info: DistInfo) -> Path:
    """``out_dir / run_name`` (default ``{task}-{model}-{UTC time}``), the same on every rank.

    Rank 0 decides and checks, and every rank gets its verdict, so that no rank can see the
    directory rank 0 is about to fill.

    Raises:
        FileExistsError: the directory exists and is not empty: another run's (a run without
            a checkpoint yet would lose its metrics and config) or not a run at all.
    """
    name = config.run_name
    if name is None:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
        name = f"{task_name}-{config.model}-{stamp}"
    problem = occupied(config.out_dir / name) if info.is_main else None
    if info.enabled:  # every rank must agree on the (time-stamped) name and the verdict
        holder = [name, problem]
        dist.broadcast_object_list(holder, src=0)
        name, problem = holder
    if problem is not None:
        raise FileExistsError(problem)
    return config.out_dir / name


def occupied(run_dir: Path) -> str | None:
    """Why a new run cannot start in ``run_dir``, or None when it is absent or empty (but for
    a lock file: a run killed before it wrote anything, or this run's own lock when checked
    again once it is held)."""
    if not run_dir.exists():
        return None
    if not run_dir.is_dir():
        return f"{run_dir} exists and is not a directory; choose another --run-name"
    entries = sorted(entry.name for entry in run_dir.iterdir() if entry.name != LOCK_FILE)
    if not entries:
        return None
    if ckpt_io.list_checkpoints(run_dir):
        return (
            f"run directory {run_dir} already holds checkpoints; pass --resume {run_dir} to "
            "continue it, or choose another --run-name"
        )
    shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
    stopped = (
        f"; it holds a run stopped before its first checkpoint, which --resume {run_dir} trains "
        "from step 0"
        if never_checkpointed(run_dir)
        else ""
    )
    return (
        f"{run_dir} already exists and is not empty ({shown}); a new run starts in an empty "
        f"directory: choose another --run-name (or --out-dir), or remove it{stopped}"
    )


def never_checkpointed(path: Path) -> bool:
    """Whether ``path`` is a run directory (it has a ``config.json``) that never completed a
    checkpoint: no ``checkpoints/step-*`` directory and no ``checkpoints/latest``, as a run
    killed before its first leaves it. Resuming it trains it from step 0."""
    root = Path(path) / ckpt_io.CHECKPOINT_DIR
    return (
        (Path(path) / "config.json").is_file()
        and not root.is_symlink()
        and not ckpt_io.list_checkpoints(path)
        and not (root / ckpt_io.LATEST_FILE).exists()
    )


def read_invocations(run_dir: Path) -> dict[str, Any] | None:
    """``run.json``'s record (``{"invocations": [...]}``), a new one when there is none, or
    None when the file is damaged (:func:`record_invocation` then keeps it aside and warns)."""
    path = run_dir / "run.json"
    if not path.exists():
        return {"invocations": []}
    try:
        record = read_json(path, MAX_RUN_RECORD_BYTES)
    except FileRefused:
        return None
    ok = isinstance(record, dict) and isinstance(record.get("invocations"), list)
    return record if ok else None


def record_invocation(
    run_dir: Path,
    config: TrainConfig,
    device: torch.device,
    info: DistInfo,
    argv: list[str] | None,
    record: dict[str, Any] | None,
) -> None:
    """Append this invocation (command line, versions, git SHA, device) to ``run.json``.

    ``record`` is :func:`read_invocations`' result, read before anything in the run changed;
    None (a damaged file) moves the file to ``run.json.damaged`` and starts a new history.
    """
    path = run_dir / "run.json"
    if record is None:
        kept = path.with_name("run.json.damaged")
        os.replace(path, kept)
        print(f"relmem: warning: {path} was damaged; kept it as {kept}", file=sys.stderr)
        record = {"invocations": []}
    record["invocations"].append(
        {
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "argv": list(sys.argv if argv is None else argv),
            "resume": None if config.resume is None else str(config.resume),
            "relmem": __version__,
            "git_sha": git_sha(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "host": platform.node(),
            "device": str(device),
            "device_name": device_name(device),
            "world_size": info.world_size,
            "num_threads": torch.get_num_threads(),
        }
    )
    write_json(path, record)


def read_json_object(path: Path, *, not_an_object: type[Exception]) -> dict[str, Any]:
    """The JSON object in ``path``, a regular file of at most :data:`MAX_RUN_JSON_BYTES`
    (:func:`relmem.files.read_json`: a FIFO or a device is refused before any read).

    Raises:
        ValueError: the file cannot be read, is too large or is not JSON (a
            :class:`~relmem.files.FileRefused` naming it).
        not_an_object: it holds JSON other than an object.
    """
    data = read_json(path, MAX_RUN_JSON_BYTES)
    if not isinstance(data, dict):
        raise not_an_object(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def record_data_identity(run_dir: Path, task: Task) -> None:
    """Write ``task.data_identity()`` to ``RUN_DIR/data.json`` (nothing when it is empty)."""
    identity = task.data_identity()
    if identity:
        write_json(run_dir / DATA_FILE, identity)


def check_data_identity(run_dir: Path, task: Task) -> None:
    """Refuse ``task``'s data when it differs from what the run recorded in ``data.json``
    (:meth:`~relmem.tasks.base.Task.data_identity`). A run without the file cannot be
    checked: nothing to say for a task that records nothing, a warning on stderr for one that
    does (a run that predates the file, or one whose file was removed).

    Raises:
        ValueError: the identities differ (naming each differing entry, recorded and now) or
            the file cannot be read.
    """
    path = Path(run_dir) / DATA_FILE
    if not path.exists():
        if task.data_identity():
            print(
                f"relmem: warning: {path} is missing, so the data cannot be checked against "
                "what the run trained on (a corpus whose lines were reordered would be read "
                "with moved ids); restore the file, or make sure the data is the run's",
                file=sys.stderr,
            )
        return
    recorded = read_json_object(path, not_an_object=ValueError)
    now = task.data_identity()
    if recorded == now:
        return
    differences = [
        f"{key}: {json.dumps(recorded.get(key))} when the run started, "
        f"{json.dumps(now.get(key))} now"
        for key in sorted(set(recorded) | set(now))
        if recorded.get(key) != now.get(key)
    ]
    raise ValueError(
        f"the data differs from what {run_dir} trained on ({path}): "
        + "; ".join(differences)
        + ". The weights would read it wrongly (a vocabulary's ids would name other words): "
        "restore the data the run used (where its config.json's task section points)"
    )


def check_checkpoint_data(run_dir: Path, ckpt: Path, task: Task) -> None:
    """Refuse ``ckpt``'s weights for ``run_dir``'s ``task`` when they were trained on other
    data: the data identity its ``meta.json`` records differs from the task's
    (:meth:`~relmem.tasks.base.Task.data_identity`), or, for a checkpoint written before
    checkpoints recorded it, the task has data and it is not one of ``run_dir``'s own (whose
    data ``data.json`` vouches for). A checkpoint of another run trained on a file of the
    same sizes loads without a shape error, and reads the run's ids as other words.

    Raises:
        ValueError: naming the checkpoint, the run and how to evaluate the checkpoint.
        CheckpointError: its ``meta.json`` cannot be read.
    """
    recorded, now = ckpt_io.recorded_data_identity(ckpt), task.data_identity()
    own = ckpt.resolve().parent == (Path(run_dir) / ckpt_io.CHECKPOINT_DIR).resolve()
    if recorded == now or (recorded is None and (own or not now)):
        return
    if recorded is None:
        why = (
            "was written before checkpoints recorded their data, and is not one of the run's "
            "own, so it may have been trained on other data"
        )
    else:
        differing = sorted(k for k in set(recorded) | set(now) if recorded.get(k) != now.get(k))
        why = f"was trained on other data (its {', '.join(differing)} differ from the run's)"
    raise ValueError(
        f"--checkpoint {ckpt} {why}: its weights would read {run_dir}'s data wrongly (a "
        "vocabulary's ids would name other words); pass the run it belongs to instead "
        f"({ckpt.parent.parent})"
    )


def trained_config(run_dir: Path, ckpt: Path) -> dict[str, Any] | None:
    """The config a run's checkpoint was trained with (``config_to_dict``'s form, with the
    ``task_name``): from ``ckpt``'s training state, else (``checkpoints/best`` of a run before
    it kept one) from the run's newest step checkpoint that holds it; None when none does.
    Every checkpoint of a run has the same model (a resume cannot change it)."""
    for candidate in (ckpt, *reversed(ckpt_io.list_checkpoints(run_dir))):
        try:
            state = ckpt_io.load_train_state(candidate)
        except (ckpt_io.CheckpointError, OSError):
            continue
        if isinstance(state.get("config"), str):
            return json.loads(state["config"])
    return None


def check_model_unchanged(
    trained: dict[str, Any] | None, now: dict[str, Any], ckpt: Path, keep: str
) -> None:
    """Refuse ``config.json``'s model (``now``) when it differs from the one ``ckpt`` was
    trained with (``trained``; None: not recorded, nothing to compare): an edited size failed
    as a weight-shape mismatch that blamed the weights file, and an edited option such as
    ``rmc.forget_bias`` loaded the weights into another model without a word.

    Raises:
        ValueError: naming the first differing option, both values and ``keep`` (why the
            trained value must stay).
    """
    difference = None if trained is None else fixed_difference(trained, now, place=False)
    if difference is not None:
        option, before, after = difference
        raise ValueError(
            f"{ckpt} was trained with {option} = {before!r}, and the run's config.json now "
            f"says {after!r}: it was changed since; restore it ({keep})"
        )


def load_run_config(run_dir: Path) -> tuple[str, TrainConfig]:
    """``(task_name, config)`` from ``RUN_DIR/config.json`` (strictly validated).

    ``run_dir`` may also be a folder written by ``relmem export``
    (:mod:`relmem.train.exported`): its ``config.json`` holds the task and the model, and the
    training options take their defaults.

    Raises:
        FileNotFoundError: no ``config.json`` in ``run_dir``.
        ValueError / TypeError: the file does not describe a valid config (naming the file and
            the key): not JSON, not an object, an unknown key, a wrong type or a bad value.
    """
    path = Path(run_dir) / "config.json"
    if not Path(run_dir).exists():
        raise FileNotFoundError(f"{run_dir} does not exist")
    if not path.exists() and not path.is_symlink():  # one that is there is read, or refused
        raise FileNotFoundError(f"{path} not found: is {run_dir} a relmem run directory?")
    data = read_json_object(path, not_an_object=TypeError)
    if "format" in data:  # an exported model's folder
        task_name, config, _ = exported.parse_config(Path(run_dir))
        return task_name, config
    task_name = data.pop("task_name", None)
    if not isinstance(task_name, str):
        raise ValueError(f"{path}: task_name must be a string naming a task, got {task_name!r}")
    try:
        entry = get_task(task_name)
    except KeyError as exc:
        raise ValueError(f"{path}: task_name: {exc.args[0]}") from None
    try:
        config = config_from_dict(TrainConfig[entry.config_cls], data, where=str(path))
    except (TypeError, ValueError) as exc:  # a value check of a config class names no file
        message = str(exc)
        raise type(exc)(message if str(path) in message else f"{path}: {message}") from None
    return task_name, config


def load_trained(
    run_dir: Path,
    checkpoint: Path | None = None,
    device: torch.device | str = "cpu",
    max_parameters: int = MAX_PARAMETERS,
    build: ModelBuilder | None = None,
    prefer_best: bool = False,
) -> tuple[TrainConfig, str, Task, nn.Module, Path]:
    """Rebuild a run's task and model and load a checkpoint's weights.

    Args:
        run_dir: the run directory, or a folder written by ``relmem export`` (its weights; the
            task is rebuilt from its ``config.json`` and checked against its ``data.json`` and
            model spec).
        checkpoint: a checkpoint directory; None means the run's latest (with ``prefer_best``
            its ``checkpoints/best`` when it keeps one), or when that is missing or bad or its
            weights damaged, the newest intact one (named on stderr).
        device: where to put the model.
        max_parameters: refuse a model larger than this (:func:`check_model_size`).
        build: ``build(config, task) -> model`` (None: :func:`build_model`; an RL run's agent
            builder otherwise).
        prefer_best: see ``checkpoint`` (``eval``, ``generate`` and ``play`` read the best).

    Returns:
        ``(config, task_name, task, model in eval mode, checkpoint directory)``.
    """
    task_name, config = load_run_config(run_dir)
    entry = get_task(task_name)
    if build is None and entry.trainer is not None:  # the supervised builder cannot build it
        raise ValueError(
            f"{run_dir} is a run of {task_name!r}, which trains by reinforcement learning: "
            "relmem eval, plot and play read it"
        )
    folder = exported.is_exported(Path(run_dir))
    if folder and checkpoint is not None:
        raise ValueError(
            f"--checkpoint {checkpoint}: {run_dir} is an exported model, which holds one set of "
            "weights (pass the run directory to choose among its checkpoints)"
        )
    try:
        task = entry.build(config.task)
    except (OSError, ValueError) as exc:
        if not folder:
            raise
        raise ValueError(
            f"{' '.join(str(exc).split()).rstrip('.')} ({run_dir} is an exported model: "
            f"the task section of its config.json names the data it was trained on; point "
            f"those names at your copy)"
        ) from None
    check_data_identity(run_dir, task)
    if folder:
        exported.check_spec(Path(run_dir), None if entry.trainer is not None else task.spec)
    try:
        check_model_size(config, task, max_parameters, build)
    except ValueError as exc:  # the sizes come from the run's config.json: name it
        raise ValueError(f"{Path(run_dir) / 'config.json'}: {exc}") from None
    if folder:
        model = (build or build_model)(config, task).to(device)
        exported.load_weights(Path(run_dir), model, device)
        return config, task_name, task, model.eval(), Path(run_dir)
    if checkpoint is None:
        ckpt, note = ckpt_io.newest_intact(run_dir, prefer_best)
        if note:
            print(f"relmem: warning: {note}", file=sys.stderr)
    else:
        ckpt = ckpt_io.resolve_checkpoint(checkpoint)
    check_checkpoint_data(run_dir, ckpt, task)
    check_model_unchanged(
        trained_config(run_dir, ckpt),
        {"task_name": task_name, **config_to_dict(config)},
        ckpt,
        "its weights are that model's",
    )
    model = (build or build_model)(config, task).to(device)
    ckpt_io.load_weights(ckpt, model, device, verified=checkpoint is None)  # newest_intact's
    return config, task_name, task, model.eval(), ckpt
