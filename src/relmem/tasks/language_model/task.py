"""Word- or byte-level language modelling on a text corpus (``relmem train lm``).

The training stream is laid out in ``batch_size`` contiguous rows and read in windows of
``bptt`` tokens; the task is stateful, so the trainer carries the model's state from each
window to the next and detaches it at the boundary (truncated BPTT, ``docs/tasks.md`` §3.3).
Training step ``s`` reads window ``s mod W`` (``W`` windows per epoch), so a resumed run reads
the same windows. The held-out set is the validation split in ``eval_rows`` rows (10, as the
reference code), walked with the state carried over the whole split; ``relmem eval`` adds the
test split. The metric is perplexity, ``exp(Σ NLL / tokens)``, and the weights with the best
validation perplexity are kept.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import torch
import tyro
from torch import Tensor

from relmem.models.language_model import AdaptiveLogits, LMOptions, token_nll
from relmem.tasks.base import PERPLEXITY, Batch, Measure, Task, TaskSpec
from relmem.tasks.language_model import wikitext
from relmem.tasks.language_model.batching import batchify, num_windows, window
from relmem.tasks.language_model.corpus import Corpus, CorpusError, load_corpus
from relmem.tasks.registry import register_task
from relmem.validation import check_at_least, check_choice

__all__ = ["LanguageModel", "LanguageModelConfig", "open_corpus"]


@dataclass
class LanguageModelConfig:
    """The corpus, the windows and the model's ends (``--data-dir``, ``--task.bptt``, ...).

    Attributes:
        data_dir: a directory with ``wiki.{train,valid,test}.tokens`` or
            ``{train,valid,test}.txt`` (made absolute). Takes precedence over ``dataset``.
        dataset: 'wikitext-2' or 'wikitext-103', fetched into ``$RELMEM_DATA`` if needed.
        tokenization: 'word' (``docs/tasks.md`` §3.2) or 'byte'.
        bptt: tokens per training window (truncated back-propagation through time).
        eval_rows: rows the validation and test streams are laid out in.
        embedding_size: E, the embedding (and tied decoder) width.
        embedding_dropout: dropout on the embeddings.
        output_dropout: dropout on the features entering the softmax.
        softmax: 'full' or 'adaptive' (``nn.AdaptiveLogSoftmaxWithLoss``, untied).
        tie_weights: the full softmax's weight is the embedding's.
        cutoffs: the adaptive softmax's cluster boundaries (e.g. 20000 40000 200000).
        div_value: the adaptive softmax's width divisor per cluster.
    """

    data_dir: Annotated[Path | None, tyro.conf.arg(aliases=("--data-dir",))] = None
    dataset: Annotated[
        Literal["wikitext-2", "wikitext-103"] | None, tyro.conf.arg(aliases=("--dataset",))
    ] = None
    tokenization: Literal["word", "byte"] = "word"
    bptt: int = 100
    eval_rows: int = 10
    embedding_size: int = 512
    embedding_dropout: float = 0.5
    output_dropout: float = 0.5
    softmax: Literal["full", "adaptive"] = "full"
    tie_weights: bool = True
    cutoffs: tuple[int, ...] = ()
    div_value: float = 4.0

    def __post_init__(self) -> None:
        if self.data_dir is not None:
            self.data_dir = Path(self.data_dir).expanduser().absolute()
        if self.dataset is not None:
            check_choice("task.dataset", self.dataset, tuple(wikitext.RELEASES))
        check_choice("task.tokenization", self.tokenization, ("word", "byte"))
        check_choice("task.softmax", self.softmax, ("full", "adaptive"))
        self.cutoffs = tuple(self.cutoffs)
        check_at_least("task.", self, bptt=1, eval_rows=1, embedding_size=1, div_value=1.0)
        for name in ("embedding_dropout", "output_dropout"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"task.{name} must lie in [0, 1), got {getattr(self, name)}")

    def options(self) -> LMOptions:
        """The model's ends as :class:`LMOptions`."""
        return LMOptions(
            self.embedding_dropout,
            self.output_dropout,
            self.softmax,
            self.tie_weights,
            self.cutoffs,
            self.div_value,
        )


def open_corpus(config: LanguageModelConfig) -> Corpus:
    """The corpus ``config`` names: ``data_dir``, else the ``dataset`` (fetched if needed).

    Raises:
        ValueError: no corpus named, or it cannot be read or fetched (the message says why).
    """
    if config.data_dir is not None:
        return load_corpus(config.data_dir, config.tokenization)
    if config.dataset is not None:
        expect = config.dataset if config.tokenization == "word" else None
        return load_corpus(wikitext.fetch(config.dataset), config.tokenization, expect=expect)
    raise CorpusError(
        "no corpus given: pass --data-dir DIR (a folder with wiki.{train,valid,test}.tokens or "
        "{train,valid,test}.txt) or --dataset wikitext-2 | wikitext-103"
    )


class LanguageModel(Task):
    """Next-token prediction on a corpus: ``inputs [B, T]`` ids, ``targets [B, T]`` the ids one
    step later; the metric is perplexity."""

    metric = PERPLEXITY
    stateful = True
    keep_best = True
    fresh_batches = False  # a window is training data, walked from a zero state

    def __init__(self, config: LanguageModelConfig, corpus: Corpus | None = None) -> None:
        self.config = config
        self.corpus = open_corpus(config) if corpus is None else corpus
        vocab = self.corpus.vocab_size
        self.spec = TaskSpec(
            input_size=vocab,
            seq_len=config.bptt,
            output_size=vocab,
            output="lm_softmax",
            encoding="word_embedding",
            embedding_size=config.embedding_size,
            options={"lm": config.options()},
        )
        self._rows: dict[int, Tensor] = {}

    def rows(self, batch_size: int) -> Tensor:
        """The training stream as ``[batch_size, L]`` contiguous rows (on the CPU)."""
        if batch_size not in self._rows:
            train = self.corpus.train
            self._rows[batch_size] = _rows_of(train, batch_size, "train", "--batch-size")
        return self._rows[batch_size]

    def windows_per_epoch(self, batch_size: int) -> int:
        """Training steps in one pass over the training stream at this batch size."""
        return num_windows(self.rows(batch_size).shape[1], self.config.bptt)

    def sample(self, batch_size: int, generator: torch.Generator, step: int = 0) -> Batch:
        """Window ``step mod windows_per_epoch`` of the training rows, on ``generator``'s
        device (the generator itself is not used: the data is the corpus, in order)."""
        index = step % self.windows_per_epoch(batch_size)
        inputs, targets = window(self.rows(batch_size), index, self.config.bptt)
        device = generator.device
        return Batch(inputs.to(device), targets.to(device))

    def split_batch(self, split: str, device: torch.device) -> Batch:
        """The whole ``split`` in ``eval_rows`` rows: ``inputs [R, L-1]``, ``targets [R, L-1]``."""
        rows = _rows_of(self.corpus.split(split), self.config.eval_rows, split, "--task.eval-rows")
        return Batch(rows[:, :-1].to(device), rows[:, 1:].to(device))

    def held_out(self, device: torch.device) -> Batch:
        """The validation split (:meth:`split_batch`)."""
        return self.split_batch("valid", device)

    def more_held_out(self, device: torch.device) -> dict[str, Batch]:
        """The test split."""
        return {"test": self.split_batch("test", device)}

    def measure(self, logits: Tensor | AdaptiveLogits, batch: Batch) -> dict[str, Measure]:
        """Per row: the summed NLL of its targets and their number (loss and perplexity)."""
        nll = token_nll(logits, batch.targets)  # [B, T]
        tokens = torch.full_like(nll[:, 0], nll.shape[1])  # [B]
        summed = Measure(nll.sum(1), tokens)
        return {"loss": summed, self.metric.name: summed}

    def data_identity(self) -> dict[str, Any]:
        """The vocabulary: tokenization, size and a SHA-1 of the tokens in id order (a changed
        corpus file can keep the size and move every id)."""
        vocab = self.corpus.vocab
        digest = hashlib.sha1(json.dumps(vocab, ensure_ascii=False).encode("utf-8"))
        return {
            "vocabulary": {
                "tokenization": self.corpus.tokenization,
                "size": len(vocab),
                "sha1": digest.hexdigest(),
            }
        }

    def export_vocabulary(self) -> list[str]:
        """The corpus's tokens in id order (``'byte'``: the 256 bytes as Latin-1 characters)."""
        return list(self.corpus.vocab)

    def step_labels(self, inputs: Tensor) -> list[str]:
        """The tokens of ``inputs [T]``."""
        return [self.corpus.vocab[int(i)] for i in inputs]


@register_task("lm", LanguageModelConfig)
def build_language_model(config: LanguageModelConfig) -> LanguageModel:
    return LanguageModel(config)


def _rows_of(ids: Tensor, rows: int, split: str, option: str) -> Tensor:
    """``batchify(ids, rows)``, its error naming the split and the option that set ``rows``.

    Raises:
        ValueError: the split is too short for ``rows`` rows of at least 2 tokens.
    """
    try:
        return batchify(ids, rows)
    except ValueError:
        raise ValueError(
            f"the {split} split has {ids.numel()} tokens, too few for {option} {rows} rows of "
            f"at least 2 tokens; lower {option} or use a larger corpus"
        ) from None
