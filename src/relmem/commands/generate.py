"""``relmem generate RUN_DIR --prompt TEXT --tokens N``: text sampled from a language model.

The run's best weights are used (``checkpoints/best``), else its latest checkpoint; the corpus
is reloaded (from its cache) for the vocabulary. Sampling divides the log-probabilities by
``--temperature`` (0: always the most likely token) and may keep only the ``--top-k`` most
likely tokens or the nucleus of probability ``--top-p``; ``--seed`` makes it reproducible.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import torch
import tyro
from torch import nn

from relmem.pretrained import load_pretrained
from relmem.tasks.language_model import LanguageModel, LanguageModelConfig, generate
from relmem.tasks.language_model.corpus import Corpus
from relmem.train.checkpoint import CheckpointError
from relmem.train.distributed import resolve_device
from relmem.train.exported import is_exported
from relmem.train.runs import load_trained


@dataclass
class GenerateArgs:
    """Sample text from a language model trained with ``relmem train lm``.

    Attributes:
        run_dir: the run directory.
        prompt: the text to continue (empty: start a new line).
        tokens: how many tokens (words or bytes) to sample.
        temperature: divides the log-probabilities (>= 0, finite; 0 takes the most likely token).
        seed: seeds the sampling.
        top_k: sample among the K most likely tokens only.
        top_p: sample from the smallest set of most likely tokens holding probability P.
        checkpoint: a checkpoint directory instead of the run's best (or latest).
        device: auto, cpu, cuda or mps.
    """

    run_dir: Annotated[Path, tyro.conf.Positional]
    prompt: str = ""
    tokens: int = 100
    temperature: float = 1.0
    seed: int = 0
    top_k: int | None = None
    top_p: float | None = None
    checkpoint: Path | None = None
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.tokens < 1:
            raise ValueError(f"--tokens must be >= 1, got {self.tokens}")
        if not 0 <= self.temperature < math.inf:
            raise ValueError(f"--temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_p is not None:
            raise ValueError("--top-k and --top-p exclude each other; give one")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"--top-k must be >= 1, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"--top-p must lie in (0, 1], got {self.top_p}")


def main(argv: list[str]) -> int:
    """Entry point of ``relmem generate``; prints the prompt and its continuation."""
    try:
        args = tyro.cli(GenerateArgs, args=argv, prog="relmem generate")
    except SystemExit as exc:  # tyro has printed help or a boxed error message
        return int(exc.code or 0)
    except ValueError as exc:
        print(f"relmem generate: error: {exc}", file=sys.stderr)
        return 2
    try:
        device = resolve_device(args.device)
        if is_exported(args.run_dir) and args.checkpoint is None:  # its vocabulary suffices
            model, corpus = _exported(args.run_dir, device)
        else:
            _, task_name, task, model, _ = load_trained(
                args.run_dir, args.checkpoint, device, prefer_best=True
            )
            if not isinstance(task, LanguageModel):
                raise ValueError(f"{args.run_dir} trained {task_name!r}, not a language model (lm)")
            corpus = task.corpus
        prompt = corpus.encode(args.prompt)
        if prompt.numel() == 0:  # start from a line break (<eos>, or the byte \n)
            prompt = corpus.encode("\n")
        generator = torch.Generator().manual_seed(args.seed)
        ids = generate(
            model,
            prompt,
            args.tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            generator=generator,
        )
    except (ValueError, TypeError, KeyError, CheckpointError, FileNotFoundError) as exc:
        print(f"relmem generate: error: {exc}", file=sys.stderr)
        return 2
    separator = "" if corpus.tokenization == "byte" or not args.prompt else " "
    print(args.prompt + separator + corpus.decode(ids))
    return 0


def _exported(folder: Path, device: torch.device) -> tuple[nn.Module, Corpus]:
    """A language model exported by ``relmem export`` and a corpus holding only its
    vocabulary (``vocab.json``): sampling needs no corpus files.

    Raises:
        ValueError: the folder holds another task's model, or is not a complete export.
    """
    model, vocabulary, task_name, config = load_pretrained(folder, device=device)
    if not isinstance(config.task, LanguageModelConfig) or vocabulary is None:
        raise ValueError(f"{folder} holds a model of {task_name!r}, not a language model (lm)")
    empty = torch.zeros(0, dtype=torch.int64)
    return model, Corpus(vocabulary, empty, empty, empty, config.task.tokenization)
