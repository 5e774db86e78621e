"""Trained models to share: ``relmem export`` writes one, :func:`load_pretrained` reads it.

An exported folder (its files: :mod:`relmem.train.exported`) holds a run's best weights (or
a chosen checkpoint's), the configuration that rebuilds the model, the task's data identity
and vocabulary where it has them, and a model card (``README.md``) written from the run. It
needs neither the run directory nor, to rebuild the model, the task's data; ``relmem eval``,
``generate``, ``play`` and ``plot`` take it where they take a run directory.

With the ``hub`` extra (``huggingface_hub``), :func:`load_pretrained` also takes a Hugging Face
Hub repository id and :func:`push_to_hub` uploads a folder, through the Hub's own library.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, NamedTuple

import torch
from safetensors.torch import save_model
from torch import nn

import relmem.models as models
from relmem._version import __version__
from relmem.files import FileRefused, read_json
from relmem.tasks.base import Task
from relmem.tasks.registry import get_task
from relmem.train import exported
from relmem.train.checkpoint import (
    BEST_NAME,
    CHECKPOINT_DIR,
    META_FILE,
    MODEL_FILE,
    unwrap,
    verify_checkpoint,
)
from relmem.train.metrics import MetricsFileError, read_metrics
from relmem.train.runs import (
    MAX_PARAMETERS,
    ModelBuilder,
    check_model_size,
    load_run_config,
    load_trained,
    read_invocations,
    write_json,
)

__all__ = ["Pretrained", "export_run", "load_pretrained", "model_card", "push_to_hub"]

# what a Hub snapshot download fetches (the card too: it says what the model is)
HUB_FILES = [
    exported.CONFIG_FILE,
    MODEL_FILE,
    META_FILE,
    exported.DATA_FILE,
    exported.VOCAB_FILE,
    exported.CARD_FILE,
]
PUSH_TIMEOUT = 600.0  # seconds an upload may take in all (relmem export --push-timeout)
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?")

RunConfig = Any
"""A :class:`relmem.train.config.TrainConfig` (made by ``dataclasses.make_dataclass``, so a
type checker has no static type for it)."""


class Pretrained(NamedTuple):
    """What :func:`load_pretrained` returns.

    Attributes:
        model: the model (an RL task's agent) in eval mode, its weights loaded.
        vocabulary: the tokens in id order (token ``i`` is input/output id ``i``), several
            such lists by name for a task with more than one (words, characters), or None for
            a task that reads no tokens (``vocab.json``).
        task_name: the task it was trained on (``relmem train TASK``).
        config: the run's configuration as far as the folder keeps it (task, model, head; the
            training options take their defaults).
    """

    model: nn.Module
    vocabulary: list[str] | dict[str, list[str]] | None
    task_name: str
    config: RunConfig


def load_pretrained(
    path_or_repo_id: str | os.PathLike[str],
    *,
    device: str | torch.device = "cpu",
    max_parameters: int | None = None,
    revision: str | None = None,
) -> Pretrained:
    """A model written by ``relmem export``, rebuilt from its folder alone.

    A supervised model is built from ``config.json``'s model spec, so the task's data (a
    corpus) is not needed; an RL agent is built by its task (the game, from the config).

    Args:
        path_or_repo_id: the exported folder, or (when no such path exists, with
            ``huggingface_hub`` installed) a Hub repository id such as ``user/rmc-wikitext2``.
        device: where to put the model.
        max_parameters: refuse a model larger than this (None: 2**28, as the commands).
        revision: the Hub revision (branch, tag or commit) of a repository id.

    Returns:
        ``Pretrained(model, vocabulary, task_name, config)``.

    Raises:
        FileNotFoundError: no such folder (and not a repository id).
        ValueError: the folder is not a complete, unedited export (naming the file), the Hub
            cannot be reached or ``huggingface_hub`` is missing.
    """
    folder = _local_folder(path_or_repo_id, revision)
    limit = MAX_PARAMETERS if max_parameters is None else max_parameters
    config_file = folder / exported.CONFIG_FILE  # not an export's: read_object says why
    if not exported.is_exported(folder) and "format" not in exported.read_object(config_file):
        raise exported.ExportError(
            f"{folder} is a run directory, not an exported model: export it first "
            f"(relmem export {folder} OUT_DIR)"
        )
    config: RunConfig
    task_name, config = load_run_config(folder)
    spec = exported.read_spec(folder)
    build: ModelBuilder
    task: Any
    if spec is None:  # an RL agent: its task (the game) gives its shapes
        entry = get_task(task_name)
        if entry.trainer is None:
            raise exported.ExportError(
                f"{folder / exported.CONFIG_FILE}: spec is null, but {task_name!r} is a "
                "supervised task, whose model needs its spec"
            )
        build = _agent_builder()
        task = entry.build(config.task)
    else:

        def build(config: RunConfig, task: Any) -> nn.Module:
            torch.manual_seed(config.seed)
            return models.build_model(config.model, config.model_config(), config.head, spec)

        task = None
    try:
        check_model_size(config, task, limit, build)
    except ValueError as exc:  # the sizes come from config.json: name it
        raise exported.ExportError(f"{folder / exported.CONFIG_FILE}: {exc}") from None
    vocabulary = exported.read_vocabulary(folder, spec)
    model = build(config, task).to(device)
    exported.load_weights(folder, model, device)
    return Pretrained(model.eval(), vocabulary, task_name, config)


def _local_folder(path_or_repo_id: str | os.PathLike[str], revision: str | None) -> Path:
    """The folder itself, or a Hub repository's snapshot downloaded through
    ``huggingface_hub`` when no such path exists.

    Raises:
        FileNotFoundError: no such path, and not a repository id.
        ValueError: ``huggingface_hub`` is missing, or the download failed (offline, no such
            repository, no access).
    """
    path = Path(path_or_repo_id)
    if path.exists():
        if not path.is_dir():
            raise exported.ExportError(
                f"{path} is a file; pass the folder relmem export wrote (with {MODEL_FILE})"
            )
        return path
    text = str(path_or_repo_id)
    if not _REPO_ID.fullmatch(text) or text.startswith("."):
        raise FileNotFoundError(f"{path} does not exist")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise exported.ExportError(
            f"{text} is not a folder here, and reading it as a Hugging Face Hub repository id "
            "needs the huggingface_hub package: pip install 'relmem[hub]'"
        ) from None
    try:
        return Path(snapshot_download(text, revision=revision, allow_patterns=HUB_FILES))
    except Exception as exc:  # the Hub library raises many kinds (HTTP, offline, not found)
        reason = " ".join(str(exc).split())[:200]
        raise exported.ExportError(
            f"{text} is not a folder here, and downloading it from the Hugging Face Hub failed "
            f"({type(exc).__name__}: {reason}); offline, or no such repository?"
        ) from None


def _agent_builder() -> ModelBuilder:
    """The RL agent builder (the ``rl`` extra's module, imported when an RL task needs it)."""
    from relmem.rl.runs import agent_of

    return agent_of


def push_to_hub(
    folder: Path, repo_id: str, *, private: bool | None = None, timeout: float = PUSH_TIMEOUT
) -> str:
    """Upload an exported ``folder`` to the Hub repository ``repo_id`` (created if missing)
    with ``huggingface_hub``'s ``HfApi.upload_folder``; its URL.

    The upload runs in a daemon thread given ``timeout`` seconds in all: the Hub library waits
    without limit on a server that accepts the connection and never answers. An upload given
    up on is left to that thread, which ends with the process.

    Raises:
        ValueError: ``huggingface_hub`` is missing, or the upload failed (offline, not logged
            in, no write access) or took longer than ``timeout``, the message saying which.
    """
    if not exported.is_exported(Path(folder)):
        raise exported.ExportError(f"{folder} is not a folder written by relmem export")
    try:
        from huggingface_hub import HfApi
    except ImportError:
        raise exported.ExportError(
            "--push needs the huggingface_hub package: pip install 'relmem[hub]' (the folder "
            f"{folder} is written; push it later with huggingface-cli upload)"
        ) from None
    api = HfApi()
    outcome: dict[str, Any] = {}

    def upload() -> None:
        try:
            url = api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
            api.upload_folder(
                folder_path=str(folder),
                repo_id=repo_id,
                repo_type="model",
                allow_patterns=HUB_FILES,
                commit_message=f"relmem export {Path(folder).name}",
            )
            outcome["url"] = str(url)
        except Exception as exc:  # the Hub library raises many kinds (HTTP, offline, auth)
            outcome["error"] = exc

    worker = threading.Thread(target=upload, name="relmem-push-to-hub", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise exported.ExportError(
            f"pushing {folder} to the Hugging Face Hub repository {repo_id} got no answer from "
            f"{getattr(api, 'endpoint', 'the Hub')} within {timeout:g} s; check the connection "
            "(HF_ENDPOINT), or pass a larger --push-timeout for a large model on a slow link. "
            "The folder is written"
        )
    if "error" in outcome:
        exc = outcome["error"]
        reason = " ".join(str(exc).split())[:200]
        raise exported.ExportError(
            f"pushing {folder} to the Hugging Face Hub repository {repo_id} failed "
            f"({type(exc).__name__}: {reason}); offline, or not logged in (huggingface-cli "
            "login)? The folder is written"
        )
    return str(outcome["url"])


def check_destination(out: Path, force: bool) -> None:
    """Refuse an export folder that cannot be written, before any work.

    ``out`` may be missing (it is made) or empty; a non-empty one is replaced only with
    ``force`` and only when it holds an earlier export (never another folder's files).

    Raises:
        ValueError: naming ``out`` and why.
        OSError: its parent cannot be made.
    """
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} exists and is not a folder; choose another OUT_DIR")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise ValueError(
                f"{out} is not empty; pass --force to replace the model exported there, or "
                "choose another OUT_DIR"
            )
        if not exported.is_exported(out):
            raise ValueError(
                f"{out} is not empty and holds no exported model; --force replaces only an "
                "earlier export, never other files: choose another OUT_DIR"
            )
    parent = out.absolute().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ValueError(f"{out}: a parent of it is a file, not a folder") from None
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{out}: its folder {parent} is not writable; choose another OUT_DIR")


def check_outside_run(run_dir: Path, out: Path) -> None:
    """Refuse an export folder that is the run directory, holds it, or lies in its
    checkpoints folder: resuming takes every folder there for a checkpoint and pruning deletes
    it, and replacing the run with ``--force`` would lose it.

    Raises:
        ValueError: naming ``out``, the run and the fix.
    """
    run, target = run_dir.resolve(), out.resolve()
    checkpoints = run / CHECKPOINT_DIR
    if target == run or target in run.parents:
        where = "is the run directory" if target == run else "holds the run directory"
        raise ValueError(f"OUT_DIR {out} {where} {run_dir}; choose an OUT_DIR outside the run")
    if target == checkpoints or checkpoints in target.parents:
        raise ValueError(
            f"OUT_DIR {out} is inside {run_dir}'s checkpoints folder, where resuming would take "
            "it for a checkpoint and pruning would delete it; choose an OUT_DIR outside "
            f"{checkpoints}"
        )


def export_run(
    run_dir: Path,
    out_dir: Path,
    *,
    checkpoint: Path | None = None,
    force: bool = False,
    max_parameters: int = MAX_PARAMETERS,
) -> Path:
    """Write ``run_dir``'s model to the folder ``out_dir`` (:mod:`relmem.train.exported`).

    The folder is staged beside ``out_dir``, loaded back with :func:`load_pretrained` and only
    then renamed into place: a failure leaves no partial folder and an earlier export intact.

    Args:
        run_dir: the run directory.
        out_dir: the folder to write (missing or empty; with ``force`` an earlier export is
            replaced).
        checkpoint: a checkpoint directory of the run (None: its best, as ``relmem eval``
            reads it, else its latest).
        force: replace an earlier export at ``out_dir``.
        max_parameters: refuse a larger model.

    Returns:
        ``out_dir``.

    Raises:
        ValueError / CheckpointError / OSError: one line naming the file or folder (an
            ``out_dir`` inside the run's checkpoints, or holding the run:
            :func:`check_outside_run`).
    """
    run_dir, out = Path(run_dir), Path(out_dir)
    check_outside_run(run_dir, out)
    check_destination(out, force)
    if exported.is_exported(run_dir):
        raise ValueError(f"{run_dir} is already an exported model; copy the folder instead")
    task_name, _ = load_run_config(run_dir)
    rl = get_task(task_name).trainer is not None
    config, task_name, task, model, ckpt = load_trained(
        run_dir,
        checkpoint,
        "cpu",
        max_parameters,
        build=_agent_builder() if rl else None,
        prefer_best=True,
    )
    step = int(verify_checkpoint(ckpt, (MODEL_FILE,))["step"])
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        spec = None if rl else task.spec
        _write(
            staging,
            run_dir,
            ckpt,
            step,
            config,
            task_name,
            task,
            spec,
            model,
            out,
            checkpoint is not None,
        )
        load_pretrained(staging, max_parameters=max_parameters)  # what a reader will do
        _open_up(staging)
        _put_in_place(staging, out, force)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _write(
    folder: Path,
    run_dir: Path,
    ckpt: Path,
    step: int,
    config: RunConfig,
    task_name: str,
    task: Task,
    spec: Any,
    model: nn.Module,
    out: Path,
    chosen: bool,
) -> None:
    """The exported files, in ``folder`` (``chosen``: the checkpoint was named)."""
    data = exported.export_config(config, task_name, spec)
    write_json(folder / exported.CONFIG_FILE, data)
    fingerprint = json.dumps(exported.weights_fingerprint(data), sort_keys=True)
    metadata = {"format": "pt", exported.WEIGHTS_KEY: fingerprint, "relmem_step": str(step)}
    try:
        save_model(unwrap(model), str(folder / MODEL_FILE), metadata=metadata)
    except RuntimeError as exc:  # safetensors reports a full disk as a RuntimeError
        raise OSError(f"cannot write {out / MODEL_FILE}: {exc}") from exc
    identity = task.data_identity()
    if identity:
        write_json(folder / exported.DATA_FILE, identity)
    vocabulary = _vocabulary_of(task)
    if vocabulary is not None:
        text = json.dumps(vocabulary, ensure_ascii=False)
        (folder / exported.VOCAB_FILE).write_text(text + "\n", encoding="utf-8")
    hashes = {n: exported.sha256(folder / n) for n in exported.HASHED if (folder / n).exists()}
    source = {"run": Path(run_dir).absolute().name, "checkpoint": ckpt.name}
    meta = {"format_version": 1, "step": step, "sha256": hashes, "exported_from": source}
    write_json(folder / META_FILE, meta)
    card = model_card(run_dir, ckpt, step, config, task_name, task, model, out, identity, chosen)
    (folder / exported.CARD_FILE).write_text(card, encoding="utf-8")


def _vocabulary_of(task: Task) -> list[str] | dict[str, list[str]] | None:
    """``task.export_vocabulary()``, or None for a task without the method (an RL game's)."""
    vocabulary = getattr(task, "export_vocabulary", None)
    return None if vocabulary is None else vocabulary()


def _open_up(folder: Path) -> None:
    """Give the staged folder and its files (``mkdtemp`` makes the folder private) the modes
    of new ones."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for file in folder.iterdir():  # safetensors writes its file private too
        file.chmod(0o666 & ~umask)


def _put_in_place(staging: Path, out: Path, force: bool) -> None:
    """Rename ``staging`` to ``out``: into a missing or empty folder's place, or (``force``) in
    place of an earlier export, which is set aside until the new one is in place and then
    removed. ``out`` is checked again (:func:`check_destination`): files may have arrived
    there while the export was written."""
    check_destination(out, force)
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()
    if not out.exists():
        os.rename(staging, out)
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".previous", dir=out.parent))
    aside.rmdir()
    os.rename(out, aside)
    try:
        os.rename(staging, out)
    except OSError:
        os.rename(aside, out)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def model_card(
    run_dir: Path,
    ckpt: Path,
    step: int,
    config: RunConfig,
    task_name: str,
    task: Task,
    model: nn.Module,
    out: Path,
    identity: dict[str, Any],
    chosen: bool = False,
) -> str:
    """The ``README.md`` of an exported model, from the run: task, model, parameters, data, the
    held-out metric with the command that evaluates it, the training command, versions and the
    licence (Hugging Face Hub model-card front matter first)."""
    run_dir = Path(run_dir)
    metric = task.metric
    name = out.name
    which = "the best held-out" if ckpt.name == BEST_NAME else "the run's latest intact"
    which = "the chosen (--checkpoint)" if chosen else which
    count = models.count_parameters(model)
    section = json.dumps(exported.export_config(config, task_name, None)[config.model])
    head = json.dumps(list(config.head.hidden_sizes))
    spec = getattr(task, "spec", None)  # an RL agent has its own heads
    head_used = spec is not None and not spec.per_step
    lines = [
        "---",
        "license: apache-2.0",
        "library_name: relmem",
        "tags:",
        "- relmem",
        f"- {task_name}",
        f"- {config.model}",
        "---",
        "",
        f"# {task_name} / {config.model}",
        "",
        f"A model with the `{config.model}` core, trained with relmem on the `{task_name}` task, "
        "exported by "
        f"`relmem export` from run `{run_dir.absolute().name}` (checkpoint `{ckpt.name}`, "
        f"{which} weights, step {step:,}).",
        "",
        "| | |",
        "|---|---|",
        f"| task | `{task_name}` (its options: `config.json`, `task`) |",
        f"| model | `{config.model}`: `{section}` |",
        *([f"| head | an MLP, hidden sizes `{head}` |"] if head_used else []),
        f"| parameters | {count:,} |",
        f"| weights | `{MODEL_FILE}`, step {step:,} |",
        f"| data | {_data_line(identity, task)} |",
        f"| metric | {metric.description} ({'higher' if metric.higher_is_better else 'lower'} "
        "is better) |",
        "| licence | Apache-2.0 |",
        "",
        "## Held-out metric",
        "",
        *_metric_lines(run_dir, ckpt, step, task),
        "",
        "Evaluate this folder (as a run directory; `relmem generate`, `play` and `plot` take it "
        "too):",
        "",
        "```bash",
        f"relmem eval {shlex.quote(name)}",
        "```",
        "",
    ]
    if identity:
        lines += [
            "The evaluation reads the task's data where `config.json`'s `task` section points. "
            "Its paths are the names of the training data's files and folders, not where they "
            "were: edit them to point at your copy (`data.json` checks that it is the data the "
            "model was trained on).",
            "",
        ]
    lines += [
        "## Use",
        "",
        "```python",
        "import relmem",
        "",
        f'model, vocabulary, task_name, config = relmem.load_pretrained("{name}")',
        "```",
        "",
        "`vocabulary` lists the tokens in id order"
        + (" (`vocab.json`)." if _vocabulary_of(task) is not None else "; this task has none."),
        "",
        "## Training",
        "",
        *_training_lines(run_dir),
        "",
        "## Versions",
        "",
        *_version_lines(run_dir),
        f"- exported with relmem {__version__}, torch {torch.__version__}",
        "",
        "## Licence",
        "",
        "Apache-2.0, as relmem.",
        "",
    ]
    return "\n".join(lines)


def _data_line(identity: dict[str, Any], task: Task) -> str:
    """The card's data row: the data identity, or that the config generates the data."""
    if not identity:
        return "generated from the task's options (no data files)"
    vocabulary = _vocabulary_of(task)
    if isinstance(vocabulary, dict):
        sizes = ", ".join(f"{len(v):,} {name}" for name, v in vocabulary.items())
        size = f"; {sizes} in `vocab.json`"
    else:
        size = "" if vocabulary is None else f"; {len(vocabulary):,} tokens in `vocab.json`"
    return f"`{json.dumps(identity, sort_keys=True)}` (`data.json`{size})"


def _metric_lines(run_dir: Path, ckpt: Path, step: int, task: Task) -> list[str]:
    """The held-out figures of the exported weights: the evaluation during training at their
    step (``metrics.jsonl``) and a ``relmem eval`` of the same checkpoint (``eval.json``)."""
    metric = task.metric
    lines = []
    try:
        records = read_metrics(run_dir / "metrics.jsonl")
    except (OSError, MetricsFileError):
        records = []
    key = f"eval/{metric.name}"
    at_step = [r for r in records if r.get("step") == step and isinstance(r.get(key), float)]
    if at_step:
        value = at_step[-1][key]
        lines.append(
            f"- held-out {metric.description}: **{metric.format(value)}** at step {step:,} "
            "(the run's evaluation during training, `metrics.jsonl`)"
        )
    record = _eval_record(run_dir, ckpt, step)
    if record is not None and isinstance(record.get(metric.name), (int, float)):
        value = float(record[metric.name])
        lines.append(
            f"- `relmem eval`: held-out {metric.description} **{metric.format(value)}** on "
            f"{record.get('count')} {'rows' if task.stateful else 'sequences'}"
        )
        for name, more in (record.get("more_held_out") or {}).items():
            if isinstance(more, dict) and isinstance(more.get(metric.name), (int, float)):
                lines.append(
                    f"- `relmem eval`: {name} {metric.description} "
                    f"**{metric.format(float(more[metric.name]))}**"
                )
    elif record is not None and isinstance(record.get("agent"), dict):
        agent, other = record["agent"], record.get("random") or {}
        if isinstance(agent.get(metric.name), (int, float)):
            mine, random = agent[metric.name], other.get(metric.name)
            random = metric.format(random) if isinstance(random, (int, float)) else "n/a"
            lines.append(
                f"- `relmem eval` on {record.get('episodes')} test levels: {metric.description} "
                f"**{metric.format(mine)}** (a uniform random policy: {random})"
            )
    if not lines:
        lines.append(
            f"- held-out {metric.description}: not recorded for step {step:,}; "
            "`relmem eval` below measures it"
        )
    return lines


def _eval_record(run_dir: Path, ckpt: Path, step: int) -> dict[str, Any] | None:
    """``RUN_DIR/eval.json`` when it evaluated this checkpoint at this step, else None (also
    when it cannot be read: the card then has no such line)."""
    try:
        record = read_json(run_dir / "eval.json", exported.MAX_JSON_BYTES)
    except FileRefused:
        return None
    if not isinstance(record, dict) or record.get("step") != step:
        return None
    return record if Path(str(record.get("checkpoint"))).name == ckpt.name else None


def _invocations(run_dir: Path) -> list[dict[str, Any]]:
    """``RUN_DIR/run.json``'s invocation records (:func:`relmem.train.runs.read_invocations`;
    none when it cannot be read)."""
    record = read_invocations(Path(run_dir)) or {"invocations": []}
    return [i for i in record["invocations"] if isinstance(i, dict)]


def _training_lines(run_dir: Path) -> list[str]:
    """The commands that trained the run (``run.json``: the first and every resume)."""
    commands = []
    for record in _invocations(run_dir):
        argv = record.get("argv")
        if isinstance(argv, list) and argv[1:2] == ["train"]:
            commands.append(shlex.join(["relmem", *map(_without_folders, argv[1:])]))
    if not commands:
        return [
            "Started from Python rather than `relmem train`; `config.json` of the run "
            "holds every option."
        ]
    lines = ["```bash", *commands, "```"]
    if len(commands) > 1:
        lines.insert(0, "The first command, then each resume:")
        lines.insert(1, "")
    return lines


def _without_folders(argument: Any) -> str:
    """A command-line argument with an absolute path in it (``/home/me/data``,
    ``--data-dir=/home/me/data``) cut to its last component (``data``): the card does not
    publish the trainer's directory layout."""
    text = str(argument)
    if text.startswith("--") and "=" in text:
        option, value = text.split("=", 1)
        return f"{option}={_without_folders(value)}"
    return Path(text).name if os.path.isabs(text) else text


def _version_lines(run_dir: Path) -> list[str]:
    """The training's versions (``run.json``'s first invocation)."""
    found = _invocations(run_dir)
    if not found:
        return ["- trained with: not recorded (no run.json)"]
    first = found[0]
    sha = first.get("git_sha")
    return [
        f"- trained with relmem {first.get('relmem')}"
        + (f" (git {str(sha)[:12]})" if sha else "")
        + f", torch {first.get('torch')}, Python {first.get('python')}, on "
        f"{first.get('device_name') or first.get('device')}"
    ]
