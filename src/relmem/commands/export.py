"""``relmem export RUN_DIR OUT_DIR``: a trained model as a folder to share.

The folder (:mod:`relmem.pretrained`, files in :mod:`relmem.train.exported`) holds
``config.json``, ``model.safetensors`` (the run's best weights, as ``relmem eval`` reads them,
or ``--checkpoint``'s), ``meta.json``, the task's ``data.json`` and ``vocab.json`` where it has
them, and a model card, ``README.md``. It is staged beside OUT_DIR and renamed into place, so a
failure leaves nothing half-written. ``--push USER/NAME`` then uploads it to the Hugging Face
Hub (the ``hub`` extra).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import tyro

from relmem.commands.errors import describe_error
from relmem.pretrained import PUSH_TIMEOUT, export_run, push_to_hub
from relmem.train.checkpoint import CheckpointError
from relmem.train.runs import MAX_PARAMETERS


@dataclass
class ExportArgs:
    """Export a trained run's model to a self-contained folder (and optionally the Hub).

    Attributes:
        run_dir: the run directory written by ``relmem train``.
        out_dir: the folder to write; it must be missing or empty (see ``--force``).
        checkpoint: a checkpoint directory of the run instead of its best (or latest).
        force: replace the model exported earlier at OUT_DIR (a folder holding anything else
            is never replaced).
        push: a Hugging Face Hub repository id (``user/name``) to upload the folder to, with
            ``huggingface_hub`` (``pip install 'relmem[hub]'``; log in first with
            ``huggingface-cli login``).
        push_timeout: seconds the upload may take in all before it is given up on (a Hub
            endpoint that accepts the connection and never answers would hang the command).
        max_parameters: refuse to build a model larger than this.
    """

    run_dir: Annotated[Path, tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR")]
    out_dir: Annotated[Path, tyro.conf.Positional, tyro.conf.arg(metavar="OUT_DIR")]
    checkpoint: Path | None = None
    force: bool = False
    push: str | None = None
    push_timeout: float = PUSH_TIMEOUT
    max_parameters: int = MAX_PARAMETERS


def main(argv: list[str]) -> int:
    """Entry point of ``relmem export``; prints the folder's files (and the Hub URL)."""
    try:
        args = tyro.cli(ExportArgs, args=argv, prog="relmem export")
    except SystemExit as exc:  # tyro has printed help or a boxed error message
        return int(exc.code or 0)
    if not (math.isfinite(args.push_timeout) and args.push_timeout > 0):
        return _error(
            f"--push-timeout must be a finite number of seconds > 0, got {args.push_timeout}"
        )
    try:
        out = export_run(
            args.run_dir,
            args.out_dir,
            checkpoint=args.checkpoint,
            force=args.force,
            max_parameters=args.max_parameters,
        )
    except (ValueError, TypeError, KeyError, CheckpointError, OSError) as exc:
        return _error(describe_error(exc, "--checkpoint"))
    files = sorted(p for p in out.iterdir() if p.is_file())
    listing = ", ".join(f"{p.name} ({p.stat().st_size:,} bytes)" for p in files)
    print(f"written {out}: {listing}")
    if args.push is not None:
        try:
            url = push_to_hub(out, args.push, timeout=args.push_timeout)
        except ValueError as exc:
            return _error(describe_error(exc, "--checkpoint"))
        print(f"pushed to {url}")
    return 0


def _error(message: str) -> int:
    print(f"relmem export: error: {message}", file=sys.stderr)
    return 2
