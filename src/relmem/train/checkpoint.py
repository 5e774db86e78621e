"""Atomic, validated checkpoints: safetensors weights plus a ``weights_only`` training state.

Layout under a run directory::

    checkpoints/
      step-00001000/
        model.safetensors   # the unwrapped module's weights (safetensors.torch.save_model)
        train_state.pt      # optimizer, scheduler, step, RNG states, counters (plain tensors)
        meta.json           # step and the SHA-256 of both files, written last
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

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model
from torch import nn

CHECKPOINT_DIR = "checkpoints"
MODEL_FILE = "model.safetensors"
STATE_FILE = "train_state.pt"
META_FILE = "meta.json"
LATEST_FILE = "latest"
BEST_NAME = "best"
FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint is missing, truncated, corrupt or does not fit the model."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


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


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete-looking checkpoint directories of ``run_dir``, oldest first."""
    root = Path(run_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-")]
    return sorted(found, key=lambda p: p.name)


def save_checkpoint(
    run_dir: Path, step: int, model: nn.Module, train_state: dict[str, Any], keep: int = 2
) -> Path:
    """Write the checkpoint for ``step`` atomically and prune old ones.

    Args:
        run_dir: the run directory.
        step: optimiser steps taken so far.
        model: the model (wrappers are removed; the plain module's weights are saved).
        train_state: a dict of tensors, numbers, strings, lists and dicts (``weights_only``).
        keep: complete checkpoints to keep, newest first.

    Returns:
        The checkpoint directory.
    """
    root = Path(run_dir) / CHECKPOINT_DIR
    final = _write_checkpoint(root / checkpoint_name(step), step, model, train_state)
    _write_text_atomic(root / LATEST_FILE, final.name + "\n")
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def save_best(run_dir: Path, step: int, model: nn.Module, record: dict[str, Any]) -> Path:
    """Write ``model``'s weights as ``checkpoints/best`` atomically (replacing the previous
    one), with ``record`` (the step and the metric) as its training state."""
    return _write_checkpoint(Path(run_dir) / CHECKPOINT_DIR / BEST_NAME, step, model, record)


def best_checkpoint(run_dir: Path) -> Path | None:
    """``run_dir``'s ``checkpoints/best``, or None if the run keeps none."""
    best = Path(run_dir) / CHECKPOINT_DIR / BEST_NAME
    return best if (best / META_FILE).is_file() else None


def _write_checkpoint(
    final: Path, step: int, model: nn.Module, train_state: dict[str, Any]
) -> Path:
    """Stage, fsync and rename a checkpoint directory into place at ``final``."""
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = final.parent / f".{final.name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    save_model(unwrap(model), str(staging / MODEL_FILE))
    torch.save({"format_version": FORMAT_VERSION, **train_state}, staging / STATE_FILE)
    meta = {
        "format_version": FORMAT_VERSION,
        "step": step,
        "sha256": {name: _sha256(staging / name) for name in (MODEL_FILE, STATE_FILE)},
    }
    (staging / META_FILE).write_text(json.dumps(meta, indent=2))
    for name in (MODEL_FILE, STATE_FILE, META_FILE):
        _fsync(staging / name)
    if final.exists():  # re-saving the same step (e.g. a signal right after a periodic save)
        shutil.rmtree(final)
    os.replace(staging, final)
    return final


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint directory from a run directory (its ``latest``) or a checkpoint directory."""
    path = Path(path)
    if (path / META_FILE).exists() or (path / MODEL_FILE).exists():
        return path
    latest = path / CHECKPOINT_DIR / LATEST_FILE
    if latest.is_file():
        return path / CHECKPOINT_DIR / latest.read_text().strip()
    if not path.exists():
        raise CheckpointError(f"{path} does not exist")
    raise CheckpointError(f"{path} holds no checkpoint (no {CHECKPOINT_DIR}/{LATEST_FILE})")


def _fallback_hint(ckpt: Path) -> str:
    run_dir = ckpt.parent.parent
    older = [p for p in list_checkpoints(run_dir) if p.name < ckpt.name]
    if not older:
        return "No earlier checkpoint is available."
    return f"The previous checkpoint is {older[-1]}; pass it to --resume to continue from it."


def verify_checkpoint(ckpt: Path) -> dict[str, Any]:
    """Check that ``ckpt``'s files exist and match their recorded hashes; return meta.json."""
    meta_path = ckpt / META_FILE
    try:
        meta = json.loads(meta_path.read_text())
        hashes = meta["sha256"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"checkpoint metadata {meta_path} is missing or unreadable ({exc}). "
            + _fallback_hint(ckpt)
        ) from exc
    for name in (MODEL_FILE, STATE_FILE):
        file = ckpt / name
        if not file.is_file():
            raise CheckpointError(f"checkpoint file {file} is missing. " + _fallback_hint(ckpt))
        if _sha256(file) != hashes.get(name):
            raise CheckpointError(
                f"checkpoint file {file} is truncated or corrupt (its SHA-256 does not match "
                f"{meta_path}). " + _fallback_hint(ckpt)
            )
    return meta


def load_weights(ckpt: Path, model: nn.Module, device: torch.device | str = "cpu") -> None:
    """Load ``model.safetensors`` of ``ckpt`` into ``model`` (strict), after verification."""
    verify_checkpoint(ckpt)
    file = ckpt / MODEL_FILE
    try:
        missing, unexpected = load_model(unwrap(model), str(file), strict=True, device=str(device))
    except (SafetensorError, RuntimeError, OSError) as exc:
        raise CheckpointError(f"cannot load weights from {file}: {exc}") from exc
    if missing or unexpected:  # strict=True raises first; kept for older safetensors
        raise CheckpointError(f"{file}: missing {missing}, unexpected {unexpected}")


def load_train_state(ckpt: Path) -> dict[str, Any]:
    """Load ``train_state.pt`` of ``ckpt`` with ``torch.load(weights_only=True)``, on the CPU."""
    verify_checkpoint(ckpt)
    file = ckpt / STATE_FILE
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for damaged zip archives
        raise CheckpointError(f"cannot read training state {file}: {exc}") from exc
    version = state.get("format_version") if isinstance(state, dict) else None
    if version != FORMAT_VERSION:
        raise CheckpointError(f"{file}: unsupported format version {version!r}")
    return state
