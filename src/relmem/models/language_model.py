"""The language model's ends: a word embedding in, a (tied) softmax out.

With any registered core between them (``--model rmc | lstm | dnc``) this is the model of
``docs/tasks.md`` §3.4: ``ids [B, T] -> embedding (dropout) -> core -> Linear to the embedding
width (when the core's width differs) -> dropout -> decoder``. The decoder is a full softmax
whose weight is the embedding's (tied), or ``nn.AdaptiveLogSoftmaxWithLoss`` for large
vocabularies (untied: its head and tail clusters have shapes of their own).

A task asks for them with ``TaskSpec(encoding='word_embedding', output='lm_softmax', ...)`` and
sets them up through ``TaskSpec.options`` (:class:`LMOptions`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch.nn.functional as F
from torch import Tensor, nn

from relmem.models.encoders import register_encoder
from relmem.models.heads import HeadConfig, register_head
from relmem.models.spec import TaskSpec, register_option
from relmem.validation import check_float, check_int

__all__ = [
    "AdaptiveLogits",
    "LMOptions",
    "LMSoftmax",
    "WordEmbedding",
    "log_probs",
    "lm_options",
    "token_nll",
]


@register_option
@dataclass(frozen=True)
class LMOptions:
    """The language model's settings, carried in ``TaskSpec.options['lm']``.

    Attributes:
        embedding_dropout: dropout on the word embeddings.
        output_dropout: dropout on the features entering the softmax.
        softmax: 'full' or 'adaptive'.
        tie_weights: the full softmax's weight is the embedding's.
        cutoffs: the adaptive softmax's cluster boundaries (increasing, below the vocabulary).
        div_value: the adaptive softmax's width divisor from one cluster to the next.
    """

    embedding_dropout: float = 0.5
    output_dropout: float = 0.5
    softmax: str = "full"
    tie_weights: bool = True
    cutoffs: tuple[int, ...] = ()
    div_value: float = 4.0


def lm_options(spec: TaskSpec) -> LMOptions:
    """The :class:`LMOptions` of ``spec`` (the defaults when it gives none)."""
    return spec.options.get("lm", LMOptions())


class AdaptiveLogits(NamedTuple):
    """What the model emits with the adaptive softmax: the features and the softmax itself,
    so that only the targets' log-probabilities are computed for the loss.

    Attributes:
        features: ``[B, T, E]``.
        softmax: the ``nn.AdaptiveLogSoftmaxWithLoss`` of the model.
    """

    features: Tensor
    softmax: nn.AdaptiveLogSoftmaxWithLoss

    def nll(self, targets: Tensor) -> Tensor:
        """``[B, T]`` negative log-likelihood of ``targets [B, T]``."""
        flat = self.features.flatten(0, 1).float()
        logp = self.softmax(flat, targets.flatten()).output.view_as(targets)
        # A tail cluster none of whose words is a target here gets no gradient, and DDP then
        # stalls waiting for it: a zero term puts every tail parameter in the graph.
        zero = sum(p.flatten()[0] for p in self.softmax.tail.parameters()) * 0.0
        return zero - logp

    def log_probs(self) -> Tensor:
        """``[B, T, V]`` log-probabilities of every token."""
        flat = self.softmax.log_prob(self.features.flatten(0, 1).float())
        return flat.view(*self.features.shape[:2], -1)


def token_nll(output: Tensor | AdaptiveLogits, targets: Tensor) -> Tensor:
    """``[B, T]`` negative log-likelihood of ``targets [B, T]`` under the model's ``output``
    (full-softmax logits ``[B, T, V]``, or :class:`AdaptiveLogits`)."""
    if isinstance(output, AdaptiveLogits):
        return output.nll(targets)
    flat = F.cross_entropy(output.flatten(0, 1).float(), targets.flatten(), reduction="none")
    return flat.view_as(targets)


def log_probs(output: Tensor | AdaptiveLogits) -> Tensor:
    """``[B, T, V]`` log-probabilities from the model's ``output``."""
    if isinstance(output, AdaptiveLogits):
        return output.log_probs()
    return F.log_softmax(output.float(), dim=-1)


class WordEmbedding(nn.Module):
    """``ids [B, T]`` int64 -> ``[B, T, E]``: an embedding table, then dropout.

    Initialised uniform in ±0.1, as ``pytorch/examples`` ``word_language_model`` does (the
    table doubles as the tied decoder's weight).
    """

    def __init__(self, vocab_size: int, embedding_size: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_size)
        self.dropout = nn.Dropout(dropout)
        nn.init.uniform_(self.embedding.weight, -0.1, 0.1)

    @property
    def output_size(self) -> int:
        """E, the embedding width."""
        return self.embedding.embedding_dim

    @property
    def weight(self) -> nn.Parameter:
        """The ``[V, E]`` table."""
        return self.embedding.weight

    def forward(self, ids: Tensor) -> Tensor:
        return self.dropout(self.embedding(ids))


class LMSoftmax(nn.Module):
    """``outputs [B, T, H]`` -> ``[Linear(H, E)] -> dropout -> decoder``.

    Returns ``logits [B, T, V]`` (full softmax) or :class:`AdaptiveLogits`. The projection
    exists only when the core's width H differs from E.
    """

    def __init__(
        self, core_size: int, vocab_size: int, embedding_size: int, options: LMOptions
    ) -> None:
        super().__init__()
        self.projection = (
            nn.Linear(core_size, embedding_size) if core_size != embedding_size else None
        )
        self.dropout = nn.Dropout(options.output_dropout)
        self.tie_weights = options.tie_weights and options.softmax == "full"
        self.decoder: nn.Module
        if options.softmax == "full":
            self.decoder = nn.Linear(embedding_size, vocab_size)
            nn.init.uniform_(self.decoder.weight, -0.1, 0.1)
            nn.init.zeros_(self.decoder.bias)
        else:
            self.decoder = nn.AdaptiveLogSoftmaxWithLoss(
                embedding_size, vocab_size, list(options.cutoffs), div_value=options.div_value
            )

    def tie(self, encoder: nn.Module) -> None:
        """Share ``encoder.weight`` with the decoder, when tying is on and the encoder has a
        table of the decoder's shape ``[V, E]`` (a :class:`WordEmbedding` of the same vocabulary).
        """
        weight = getattr(encoder, "weight", None)
        if self.tie_weights and weight is not None and weight.shape == self.decoder.weight.shape:
            self.decoder.weight = weight

    def forward(self, outputs: Tensor, lengths: Tensor | None = None) -> Tensor | AdaptiveLogits:
        features = outputs if self.projection is None else self.projection(outputs)
        features = self.dropout(features)  # [B, T, E]
        if isinstance(self.decoder, nn.AdaptiveLogSoftmaxWithLoss):
            return AdaptiveLogits(features, self.decoder)
        return self.decoder(features)  # [B, T, V]


def _check(spec: TaskSpec, size: str) -> tuple[int, int, LMOptions]:
    """The vocabulary (``spec.input_size`` or ``spec.output_size``), the width and the options,
    checked."""
    vocab = check_int(size, getattr(spec, size), owner="language model")
    width = check_int("embedding_size", spec.embedding_size, owner="language model")
    options = lm_options(spec)
    for name in ("embedding_dropout", "output_dropout"):
        value = check_float(name, getattr(options, name), minimum=0.0, owner="language model")
        if value >= 1:
            raise ValueError(f"language model: {name} must be < 1, got {value}")
    if options.softmax not in ("full", "adaptive"):
        raise ValueError(
            f"language model: softmax must be 'full' or 'adaptive', got {options.softmax!r}"
        )
    if options.softmax == "adaptive":
        cutoffs = list(options.cutoffs)
        if not cutoffs or cutoffs != sorted(set(cutoffs)) or cutoffs[0] < 1 or cutoffs[-1] >= vocab:
            raise ValueError(
                "language model: the adaptive softmax needs cutoffs that increase strictly, "
                f"from >= 1 to below the vocabulary size {vocab}; got {tuple(cutoffs)}"
            )
        narrowest = int(width // options.div_value ** len(cutoffs))
        if narrowest < 1:
            raise ValueError(
                f"language model: the adaptive softmax's last cluster would be {width} // "
                f"{options.div_value:g}^{len(cutoffs)} = 0 wide; use a smaller div_value or "
                "fewer cutoffs"
            )
    return vocab, width, options


@register_encoder("word_embedding")
def build_word_embedding(spec: TaskSpec) -> WordEmbedding:
    """:class:`WordEmbedding` of ``spec.input_size`` tokens, ``spec.embedding_size`` wide."""
    vocab, width, options = _check(spec, "input_size")
    return WordEmbedding(vocab, width, options.embedding_dropout)


@register_head("lm_softmax")
def build_lm_softmax(config: HeadConfig, core_size: int, spec: TaskSpec) -> LMSoftmax:
    """:class:`LMSoftmax` from the core's width to ``spec.output_size`` tokens."""
    vocab, width, options = _check(spec, "output_size")
    return LMSoftmax(core_size, vocab, width, options)
