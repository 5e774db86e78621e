"""Atomic, validated checkpoints: safetensors weights plus a ``weights_only`` training state.

Layout under a run directory::

    checkpoints/
      step-00001000/
        model.safetensors   # the unwrapped module's weights (safetensors.torch.save_model)
        train_state.pt      # optimizer, scheduler, step, RNG states, counters (plain tensors)
        meta.json           # step, the SHA-256 of both files and the task's data identity
                            # (what the weights read through, a vocabulary), written last
      latest                # text file: the name of the newest complete checkpoint
      best/                 # optional: the weights with the best held-out metric, written
                            # like a checkpoint; its train_state.pt holds only the step and the
                            # metric (for eval and sampling; not resumable)

A checkpoint is written into a hidden staging directory, fsync'ed, then renamed into place
with ``os.replace``; only then does ``latest`` move (also with ``os.replace``) and are checkpoints
beyond ``keep`` deleted, oldest first. A crash at any point leaves the previous checkpoint
complete. Loading checks the hashes and the file formats and raises :class:`CheckpointError`
naming the bad file and the previous complete checkpoint.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model
from torch import nn

from relmem.files import MiB, file_digest, read_json
from relmem.train import faults

CHECKPOINT_DIR = "checkpoints"
MODEL_FILE = "model.safetensors"
STATE_FILE = "train_state.pt"
META_FILE = "meta.json"
LATEST_FILE = "latest"
BEST_NAME = "best"
FORMAT_VERSION = 1
DATA_IDENTITY_KEY = "data_identity"  # meta.json's record of Task.data_identity (absent before)
MAX_META_BYTES = 16 * MiB  # meta.json: well under a kilobyte without a data identity


class CheckpointError(RuntimeError):
    """A checkpoint is missing, truncated, corrupt or does not fit the model.

    Attributes:
        fallback: the newest intact-looking checkpoint before the bad one, if any; each command
            names it with its own option (``--resume``, ``--checkpoint``).
    """

    def __init__(self, message: str, fallback: Path | None = None) -> None:
        super().__init__(message)
        self.fallback = fallback


def _sha256(path: Path) -> str:
    return file_digest(path, "sha256")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    _fsync(tmp)
    os.replace(tmp, path)


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module inside DDP (``.module``) and ``torch.compile`` (``._orig_mod``) wrappers."""
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def checkpoint_name(step: int) -> str:
    """The directory name of the checkpoint at ``step``."""
    return f"step-{step:08d}"


def checkpoint_step(path: Path) -> int:
    """The step of a ``step-NNNNNNNN`` checkpoint directory."""
    return int(path.name.split("-", 1)[1])


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete-looking checkpoint directories of ``run_dir``, oldest first (by step: past
    ``step-99999999`` the names no longer sort). Symbolic links are not the run's own
    checkpoints and are left out; so is a ``checkpoints/`` that is itself a link."""
    root = Path(run_dir) / CHECKPOINT_DIR
    if not root.is_dir() or root.is_symlink():
        return []
    found = [
        p
        for p in root.iterdir()
        if re.fullmatch(r"step-\d{8,}", p.name) and p.is_dir() and not p.is_symlink()
    ]
    return sorted(found, key=checkpoint_step)


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: nn.Module,
    train_state: dict[str, Any],
    data_identity: dict[str, Any],
    keep: int = 2,
) -> Path:
    """Write the checkpoint for ``step`` atomically and prune old ones.

    Args:
        run_dir: the run directory.
        step: optimiser steps taken so far.
        model: the model (wrappers are removed; the plain module's weights are saved).
        train_state: a dict of tensors, numbers, strings, lists and dicts (``weights_only``).
        data_identity: the task's :meth:`~relmem.tasks.base.Task.data_identity`, recorded in
            ``meta.json`` (:func:`recorded_data_identity`).
        keep: complete checkpoints to keep, newest first.

    Returns:
        The checkpoint directory.
    """
    root = Path(run_dir) / CHECKPOINT_DIR
    final = _write_checkpoint(root / checkpoint_name(step), step, model, train_state, data_identity)
    faults.kill_if_armed("checkpoint-rename", step)
    _write_text_atomic(root / LATEST_FILE, final.name + "\n")
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def set_aside_newer(run_dir: Path, step: int) -> Path | None:
    """Move ``run_dir``'s checkpoints past ``step`` out of the way of a run resumed at
    ``step``.

    They belong to a history the resumed run replaces (its metrics are cut back to ``step``):
    left in place, pruning, which keeps the highest steps, would delete the resumed run's new
    checkpoints and keep them, and ``best`` could name weights the new history never had. The
    ``step-*`` directories past ``step``, and ``best`` when it was saved past ``step``, go to
    ``checkpoints/abandoned-after-step-NNNNNNNN`` (``-2``, ``-3``, ... if taken), and
    ``latest`` names ``step``'s checkpoint.

    Returns:
        The folder they were moved to, or None when nothing was past ``step``.
    """
    root = Path(run_dir) / CHECKPOINT_DIR
    newer = [p for p in list_checkpoints(run_dir) if checkpoint_step(p) > step]
    best = best_checkpoint(run_dir)
    if best is not None:
        try:
            best_step = read_json(best / META_FILE, MAX_META_BYTES)["step"]
        except (ValueError, KeyError, TypeError):
            best_step = None  # unreadable: keep it where eval reports it
        if isinstance(best_step, int) and best_step > step:
            newer.append(best)
    if not newer:
        return None
    folder = root / f"abandoned-after-{checkpoint_name(step)}"
    suffix = 1
    while folder.exists():
        suffix += 1
        folder = root / f"abandoned-after-{checkpoint_name(step)}-{suffix}"
    folder.mkdir()
    for path in newer:
        os.replace(path, folder / path.name)
    if (root / checkpoint_name(step)).is_dir():
        _write_text_atomic(root / LATEST_FILE, checkpoint_name(step) + "\n")
    return folder


def save_best(
    run_dir: Path,
    step: int,
    model: nn.Module,
    record: dict[str, Any],
    data_identity: dict[str, Any],
) -> Path:
    """Write ``model``'s weights as ``checkpoints/best`` atomically (replacing the previous
    one), with ``record`` (the step and the metric) as its training state and
    ``data_identity`` in its ``meta.json`` (as :func:`save_checkpoint`)."""
    best = Path(run_dir) / CHECKPOINT_DIR / BEST_NAME
    return _write_checkpoint(best, step, model, record, data_identity)


def best_checkpoint(run_dir: Path) -> Path | None:
    """``run_dir``'s ``checkpoints/best`` (or, after a kill while it was being replaced, the
    copy set aside then), or None if the run keeps none."""
    best = Path(run_dir) / CHECKPOINT_DIR / BEST_NAME
    for candidate in (best, _previous(best)):
        if (candidate / META_FILE).is_file() and not candidate.is_symlink():
            return candidate
    return None


def _write_checkpoint(
    final: Path,
    step: int,
    model: nn.Module,
    train_state: dict[str, Any],
    data_identity: dict[str, Any],
) -> Path:
    """Stage, fsync and rename a checkpoint directory into place at ``final``, its
    ``meta.json`` recording ``data_identity``.

    A directory already at ``final`` (``best``, or the same step saved again after a signal)
    is renamed aside before the staged one takes its place and deleted after, so that a kill
    in between leaves one of them (:func:`best_checkpoint` finds the one set aside).

    Raises:
        OSError: a file could not be written (a full disk, say), naming it; the staging
            directory is removed and the previous checkpoint is untouched.
        CheckpointError: ``checkpoints/`` is a symbolic link.
    """
    _refuse_link(final.parent)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = final.parent / f".{final.name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    file = staging / MODEL_FILE
    try:
        save_model(unwrap(model), str(file))
        faults.kill_if_armed("checkpoint", step)
        file = staging / STATE_FILE
        torch.save({"format_version": FORMAT_VERSION, **train_state}, file)
        meta = {
            "format_version": FORMAT_VERSION,
            "step": step,
            "sha256": {name: _sha256(staging / name) for name in (MODEL_FILE, STATE_FILE)},
            DATA_IDENTITY_KEY: data_identity,
        }
        file = staging / META_FILE
        file.write_text(json.dumps(meta, indent=2))
        for name in (MODEL_FILE, STATE_FILE, META_FILE):
            _fsync(staging / name)
    except (OSError, RuntimeError, SafetensorError) as exc:  # torch.save: RuntimeError
        shutil.rmtree(staging, ignore_errors=True)
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise OSError(
            f"cannot write the checkpoint's {file.name} in {final.parent} ({reason}; is the "
            "disk full?); the previous checkpoint is intact"
        ) from exc
    previous = _previous(final)
    if final.exists():
        shutil.rmtree(previous, ignore_errors=True)
        os.replace(final, previous)
    os.replace(staging, final)
    shutil.rmtree(previous, ignore_errors=True)
    return final


def _previous(final: Path) -> Path:
    """Where :func:`_write_checkpoint` sets aside the directory it replaces."""
    return final.parent / f".{final.name}.previous"


def _refuse_link(path: Path) -> None:
    """Refuse a run's ``checkpoints/`` or checkpoint directory that is a symbolic link: the run
    would read, write or prune another place through it.

    Raises:
        CheckpointError: naming the link.
    """
    if path.is_symlink():
        raise CheckpointError(
            f"{path} is a symbolic link; a run's checkpoints must be its own directories "
            "(through a link it would read, write or prune another run's)"
        )


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint directory from a run directory (its ``latest``), its ``checkpoints/latest``
    file, or a checkpoint directory.

    ``latest`` must hold the name of a ``step-NNNNNNNN`` directory of the same ``checkpoints/``
    directory (no path, no ``..``, no link out of it): a run is never resumed, evaluated or
    pruned through another run's files.

    Raises:
        CheckpointError: no such path, another file, no or a bad ``latest``, or a checkpoint
            directory that is not inside a run's ``checkpoints/`` (its ``fallback`` is the
            newest checkpoint).
    """
    path = Path(path)
    if path.is_file():
        if path.name == LATEST_FILE and path.parent.name == CHECKPOINT_DIR:
            return resolve_checkpoint(path.parent.parent)
        raise CheckpointError(
            f"{path} is a file; pass a run directory or one of its {CHECKPOINT_DIR}/step-* "
            "directories"
        )
    if (path / META_FILE).exists() or (path / MODEL_FILE).exists():
        _refuse_link(path)
        _refuse_link(path.parent)
        if path.resolve().parent.name != CHECKPOINT_DIR:
            raise CheckpointError(
                f"{path} is not inside a run's {CHECKPOINT_DIR}/ directory; pass the run "
                f"directory or one of its {CHECKPOINT_DIR}/step-* directories"
            )
        return path
    if not path.exists():
        raise CheckpointError(f"{path} does not exist")
    root = path / CHECKPOINT_DIR
    _refuse_link(root)
    latest = root / LATEST_FILE
    newest = list_checkpoints(path)
    fallback = newest[-1] if newest else None
    if not latest.is_file():
        if fallback is None:
            raise CheckpointError(f"{path} holds no checkpoint (no {CHECKPOINT_DIR}/step-*)")
        raise CheckpointError(f"{latest} is missing; the newest checkpoint is {fallback}", fallback)
    try:
        name = latest.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"cannot read {latest}: {exc}", fallback) from exc
    target = root / name
    inside = (
        re.fullmatch(r"step-\d{8,}", name) is not None
        and target.is_dir()
        and not target.is_symlink()
        and target.resolve().parent == root.resolve()
    )
    if not inside:
        raise CheckpointError(
            f"{latest} names {name[:80]!r}, which is not a checkpoint directory of this run "
            f"(a step-NNNNNNNN directory in {root})"
            + (f"; the newest checkpoint is {fallback}" if fallback else ""),
            fallback,
        )
    return target


def newest_intact(run_dir: Path, prefer_best: bool = False) -> tuple[Path, str | None]:
    """The checkpoint of ``run_dir`` to read weights from when none is named.

    With ``prefer_best``, ``checkpoints/best`` when the run keeps one and its weights verify.
    Otherwise (or failing that) ``latest``'s checkpoint when it resolves and its weights
    verify, and failing that the newest checkpoint whose weights verify; with a note saying
    which and why whenever a checkpoint the reader would have taken was passed over.

    Raises:
        CheckpointError: no checkpoint of the run has intact weights.
    """
    problems = []
    best = best_checkpoint(run_dir) if prefer_best else None
    if best is not None:
        try:
            verify_checkpoint(best, (MODEL_FILE,))
            return best, None
        except CheckpointError as exc:
            problems.append(exc)
    try:
        ckpt = resolve_checkpoint(run_dir)
        verify_checkpoint(ckpt, (MODEL_FILE,))
    except CheckpointError as exc:
        problems.append(exc)
    else:
        return ckpt, _passed_over(problems, ckpt)
    for candidate in reversed(list_checkpoints(run_dir)):
        if _intact(candidate, (MODEL_FILE,)):
            return candidate, _passed_over(problems, candidate)
    raise problems[-1]


def _passed_over(problems: list[CheckpointError], chosen: Path) -> str | None:
    """The note for a reader that takes ``chosen`` after ``problems`` (None: none)."""
    if not problems:
        return None
    reasons = "; ".join(str(p).split(". ")[0].rstrip(".") for p in problems)
    return f"{reasons}; using the newest intact checkpoint, {chosen}"


class _Damaged(Exception):
    """A checkpoint's files are missing or do not match ``meta.json`` (the message says which;
    :func:`verify_checkpoint` turns it into a :class:`CheckpointError` with a fallback)."""


def _verified_meta(ckpt: Path, files: tuple[str, ...]) -> dict[str, Any]:
    """``ckpt``'s ``meta.json`` once its ``files`` exist and match the hashes recorded there.

    Raises:
        _Damaged: what is missing or does not match.
    """
    meta_path = ckpt / META_FILE
    try:
        meta = read_json(meta_path, MAX_META_BYTES)
        hashes = meta["sha256"]
        if not isinstance(hashes, dict):
            raise TypeError(f"sha256 is {hashes!r}, not an object")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise _Damaged(f"checkpoint metadata {meta_path} is missing or unreadable ({exc})") from exc
    for name in files:
        file = ckpt / name
        if not file.is_file():
            raise _Damaged(f"checkpoint file {file} is missing")
        if _sha256(file) != hashes.get(name):
            raise _Damaged(
                f"checkpoint file {file} is truncated or corrupt (its SHA-256 does not match "
                f"{meta_path})"
            )
    return meta


def _intact(ckpt: Path, files: tuple[str, ...]) -> bool:
    """Whether ``ckpt``'s ``files`` exist and match its ``meta.json``."""
    try:
        _verified_meta(ckpt, files)
    except _Damaged:
        return False
    return True


def _fallback(ckpt: Path, files: tuple[str, ...]) -> Path | None:
    """The newest checkpoint of ``ckpt``'s run before ``ckpt`` (any ``step-*`` one when
    ``ckpt`` is ``best``) whose ``files`` are intact, if any."""
    steps = list_checkpoints(ckpt.parent.parent)
    if ckpt.name != BEST_NAME:
        steps = [p for p in steps if checkpoint_step(p) < checkpoint_step(ckpt)]
    return next((p for p in reversed(steps) if _intact(p, files)), None)


def verify_checkpoint(
    ckpt: Path, files: tuple[str, ...] = (MODEL_FILE, STATE_FILE)
) -> dict[str, Any]:
    """Check that ``ckpt``'s ``files`` exist and match their recorded hashes; return meta.json.

    Readers verify only the files they read (``eval`` needs no intact training state).

    Raises:
        CheckpointError: naming the bad file and, as its ``fallback``, the newest earlier
            checkpoint whose same files are intact.
    """
    try:
        return _verified_meta(ckpt, files)
    except _Damaged as damage:
        older = _fallback(ckpt, files)
        if older:
            hint = f"The previous intact checkpoint is {older}."
        else:
            hint = "No earlier intact checkpoint exists."
        raise CheckpointError(f"{damage}. {hint}", older) from damage.__cause__


def recorded_data_identity(ckpt: Path) -> dict[str, Any] | None:
    """The data identity ``ckpt``'s ``meta.json`` records (:func:`save_checkpoint`), or None
    for a checkpoint written before checkpoints recorded it.

    Raises:
        CheckpointError: ``meta.json`` cannot be read, or its record is not a JSON object.
    """
    meta_path = ckpt / META_FILE
    try:
        meta = read_json(meta_path, MAX_META_BYTES)
    except ValueError as exc:  # FileRefused: naming the file and why
        raise CheckpointError(f"checkpoint metadata {exc}") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{meta_path} must hold a JSON object; the file is damaged")
    identity = meta.get(DATA_IDENTITY_KEY)
    if identity is not None and not isinstance(identity, dict):
        raise CheckpointError(
            f"{meta_path}: {DATA_IDENTITY_KEY} must be a JSON object, got "
            f"{type(identity).__name__}; the file is damaged"
        )
    return identity


def load_weights(
    ckpt: Path, model: nn.Module, device: torch.device | str = "cpu", *, verified: bool = False
) -> None:
    """Load ``model.safetensors`` of ``ckpt`` into ``model`` (strict), after verification
    (skipped when ``verified``: the caller has just checked its hash, as :func:`newest_intact`
    does)."""
    if not verified:
        verify_checkpoint(ckpt, (MODEL_FILE,))
    file = ckpt / MODEL_FILE
    try:
        missing, unexpected = load_model(unwrap(model), str(file), strict=True, device=str(device))
    except (SafetensorError, RuntimeError, OSError) as exc:
        raise CheckpointError(f"cannot load weights from {file}: {exc}") from exc
    if missing or unexpected:  # strict=True raises first; kept for older safetensors
        raise CheckpointError(f"{file}: missing {missing}, unexpected {unexpected}")


def load_train_state(ckpt: Path) -> dict[str, Any]:
    """Load ``train_state.pt`` of ``ckpt`` with ``torch.load(weights_only=True)``, on the CPU."""
    verify_checkpoint(ckpt, (STATE_FILE,))
    file = ckpt / STATE_FILE
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for damaged zip archives
        older = _fallback(ckpt, (STATE_FILE,))
        reason = str(exc).split("\n")[0]
        if isinstance(exc, pickle.UnpicklingError):  # torch's text advises unsafe loading
            reason = "it holds objects other than tensors, numbers and containers"
        hint = f" The previous intact checkpoint is {older}." if older else ""
        raise CheckpointError(
            f"cannot read training state {file}: not a relmem training state ({reason}).{hint}",
            older,
        ) from exc
    version = state.get("format_version") if isinstance(state, dict) else None
    if version != FORMAT_VERSION:
        raise CheckpointError(f"{file}: unsupported format version {version!r}")
    return state
