"""The extractive reader of ``relmem train squad``: MemoReader and its ablations.

A question and a context go through, bottom to top (``docs/reading.md`` §3):

1. :class:`TokenEmbedding`: a word vector, a character CNN's max-pooled filters and two
   exact-match flags per token.
2. :class:`DenseBlock` (MemoReader's "expanded GRU"), shared by question and context: a
   projection ``p_t``, a bidirectional GRU ``r_t``, the dense connection ``g_t = [r_t; p_t]``,
   trilinear self-attention over ``g`` (within windows of the context, so any length can be
   read), output ``[r_t; q_t]``.
3. :class:`CoAttention` (BiDAF's): context-to-question and max-pooled question-to-context
   attention, fused into ``d_t``.
4. The memory, chosen by ``--model``: ``dnc`` stacks :class:`~relmem.cores.dnc.
   MemoryControllerLayer` (MemoReader), any other registered core (``rmc``, ``lstm``) runs
   in the controller's place with the same dense pre-encoder and residual (:class:`CoreMemory`),
   and ``none`` leaves ``d_t`` as it is (the paper's ablation).
5. :class:`SpanHead`: two more GRUs and a linear score per token for the start and the end, and,
   for data with unanswerable questions, a no-answer score.
6. With ``paragraph_ranks`` (``--task.rank-prior``), a learned start and end score for each
   rank of the paragraph a token stands in (the ranker's order among the row's paragraphs),
   added to the token's scores: the ranker's word on where the answer is, beside the reader's.

With ``windows`` (``--task.reading windows``), steps 2-5 read each run of context tokens
between padding steps (a row's paragraphs, one padding step apart) as a context of its own:
document-qa's independent paragraphs, their scores side by side in one row under one softmax.

:class:`Reader` takes the packed rows of :mod:`relmem.tasks.reading.data` (question block,
then context) and returns ``logits [B, 1 + T, 2]``: position 0 is "no answer", position
``1 + t`` is context token ``t``; padded tokens get ``-inf`` and change nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from relmem.cores.dnc import MemoryControllerLayer
from relmem.cores.dnc.layer import reverse_within_lengths
from relmem.cores.gru import run_gru
from relmem.models.registry import get_model, register_architecture
from relmem.models.spec import TaskSpec, register_option

__all__ = [
    "RANK_PRIOR_SCALE",
    "CoAttention",
    "CoreMemory",
    "DenseBlock",
    "Reader",
    "ReaderOptions",
    "SpanHead",
    "TokenEmbedding",
    "padding_windows",
    "windowed_self_attention",
]

_MASKED = -1e30  # a score no softmax gives weight to (finite, so a fully masked row stays finite)
# the rank prior's scores are its weights times this: an optimiser such as Adam moves a weight
# by about its learning rate a step whatever its gradient, so unscaled, a prior learned at 1e-3
# moved 0.14 in 300 steps (2026-11-28), where the held-out rows asked for 1 to 2
RANK_PRIOR_SCALE = 10.0
# a windows reader reads a batch's windows in this many groups of similar lengths (shortest
# first, equal counts), each padded to its own longest window rather than the batch's
WINDOW_GROUPS = 4


@register_option
@dataclass(frozen=True)
class ReaderOptions:
    """The reader's sizes and its data's layout (``TaskSpec.options['reader']``).

    Attributes:
        vocab_size, char_vocab_size: word and character ids (0 pad, 1 unknown).
        question_block: Q, the question steps at the start of every row.
        chars: C, character ids per token.
        word_size: the word vectors' width (300 with GloVe).
        char_embedding, char_channels, char_kernel: the character CNN's embedding width,
            filters and kernel width.
        hidden_size: h, units per GRU direction; the dense block emits 6h, the fused document
            ``d_t`` is 2h wide.
        attention_window: the context's self-attention runs within windows of this many tokens
            at two offsets half a window apart, each token taking the window it is more central
            in (stride window/2).
        memory_layers: stacked memory controllers (cores) over the fused document.
        bidirectional_controller: the memory controller's GRU has a backward direction that
            feeds its output (never the memory's interface: only the forward GRU writes).
        dropout: on the embeddings and every recurrent layer's input.
        dense_connections: every dense block's self-attention reads ``[r_t; p_t]``, the GRU's
            output beside its input (MemoReader's dense connection); False: ``r_t`` alone
            (the ablation), the blocks 4h wide instead of 6h.
        max_answer_tokens: the longest span the reader predicts.
        no_answer: score "no answer" (data with unanswerable questions).
        freeze_words: keep the word vectors fixed (pretrained ones, as the paper).
        paragraph_ranks: R > 0: the rows carry each context token's paragraph's rank (column
            ``3 + C``, from 1), and the reader learns a start and an end score for each of the
            ranks 1..R (those past R share R's; :data:`RANK_PRIOR_SCALE` times its weights),
            added to the token's scores; 0: no rank column, no such scores.
        windows: read each run of context tokens between padding steps as a context of its
            own (a row's paragraphs one padding step apart: ``--task.reading windows``), with
            its own recurrent states, attention and memory, the scores of all of a row's
            windows side by side in its logits (one softmax over them: shared
            normalisation); its "no answer" score is the best of its windows'. False: the
            whole context in one pass.
        word_vectors: returns ``[vocab_size, word_size]`` initial word vectors (None: learned
            from a random start); called once, when the model is built.
        eval_rows: rows per forward pass when not training (held-out sets are large).
    """

    vocab_size: int
    char_vocab_size: int
    question_block: int
    chars: int
    word_size: int = 100
    char_embedding: int = 16
    char_channels: int = 64
    char_kernel: int = 5
    hidden_size: int = 48
    attention_window: int = 128
    memory_layers: int = 1
    bidirectional_controller: bool = True
    dropout: float = 0.2
    dense_connections: bool = True
    max_answer_tokens: int = 17
    no_answer: bool = False
    freeze_words: bool = False
    paragraph_ranks: int = 0
    windows: bool = False
    word_vectors: Callable[[], Tensor] | None = field(default=None, compare=False, repr=False)
    eval_rows: int = 64

    @property
    def vocabulary_sizes(self) -> dict[str, int]:
        """The ids of each token table, by the name ``vocab.json`` lists it under (the words
        and the characters): what an exported folder's vocabulary is checked against."""
        return {"words": self.vocab_size, "chars": self.char_vocab_size}


def _lengths_mask(lengths: Tensor, steps: int) -> Tensor:
    """``[B, steps]`` bool, True on each row's first ``lengths[b]`` steps."""
    return torch.arange(steps, device=lengths.device) < lengths.unsqueeze(1)


class _BiGRU(nn.Module):
    """A bidirectional GRU over right-padded ``[B, T, X]`` rows -> ``[B, T, 2h]``, 0 at padded
    steps. The backward direction reads each row reversed within its length, so it starts at
    the row's last token, not at its padding: the packed-sequence result, without the
    per-step cost of packed sequences on the CPU. Each direction runs the fused GRU
    (:func:`relmem.cores.gru.run_gru`) where it can."""

    def __init__(self, input_size: int, hidden_size: int, dropout: float) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.forward_gru = nn.GRU(input_size, hidden_size, batch_first=True)
        self.backward_gru = nn.GRU(input_size, hidden_size, batch_first=True)

    def forward(self, x: Tensor, lengths: Tensor) -> Tensor:
        x = self.dropout(x)
        ahead = run_gru(x, self.forward_gru)
        reversed_x = reverse_within_lengths(x.transpose(0, 1), lengths).transpose(0, 1)
        back = run_gru(reversed_x, self.backward_gru)
        back = reverse_within_lengths(back.transpose(0, 1), lengths).transpose(0, 1)
        mask = _lengths_mask(lengths, x.shape[1]).unsqueeze(-1).to(x.dtype)
        return torch.cat([ahead, back], dim=-1) * mask


class TokenEmbedding(nn.Module):
    """``tokens [B, T, 3 + C (+ 1)]`` int -> ``[B, T, word_size + char_channels + 2]``: the
    word vector, the character CNN (max over the token's ``C`` characters) and the exact-match
    flags (a rank column after the characters is not read here)."""

    def __init__(self, o: ReaderOptions) -> None:
        super().__init__()
        self.words = nn.Embedding(o.vocab_size, o.word_size, padding_idx=0)
        if o.word_vectors is not None and not self.words.weight.is_meta:
            with torch.no_grad():
                self.words.weight.copy_(o.word_vectors())
        self.words.weight.requires_grad_(not o.freeze_words)
        self.chars = nn.Embedding(o.char_vocab_size, o.char_embedding, padding_idx=0)
        self.conv = nn.Conv1d(o.char_embedding, o.char_channels, o.char_kernel, padding="same")
        self.dropout = nn.Dropout(o.dropout)
        self.output_size = o.word_size + o.char_channels + 2
        self.width = 3 + o.chars

    def forward(self, tokens: Tensor) -> Tensor:
        batch, steps = tokens.shape[:2]
        chars = self.chars(tokens[..., 3 : self.width].reshape(batch * steps, -1))  # [BT, C, e]
        filters = F.relu(self.conv(chars.transpose(1, 2))).amax(dim=2)  # [BT, channels]
        flags = tokens[..., 1:3].to(filters.dtype)
        words = self.words(tokens[..., 0])
        features = torch.cat([words, filters.view(batch, steps, -1)], dim=-1)
        return torch.cat([self.dropout(features), flags], dim=-1)


class Trilinear(nn.Module):
    """``s_ij = w_a·x_i + w_b·y_j + w_f·(x_i ⊙ y_j)``: ``x [B, I, X]``, ``y [B, J, X]`` ->
    ``[B, I, J]``."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.w_x = nn.Linear(size, 1)
        self.w_y = nn.Linear(size, 1, bias=False)
        self.w_xy = nn.Parameter(torch.empty(size).uniform_(-(size**-0.5), size**-0.5))

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        products = torch.bmm(x * self.w_xy, y.transpose(1, 2))
        return products + self.w_x(x) + self.w_y(y).transpose(1, 2)


def windowed_self_attention(
    g: Tensor, mask: Tensor, window: int, score: Callable[[Tensor, Tensor], Tensor]
) -> Tensor:
    """Self-attention ``out_i = Σ_j softmax_j(score(g, g)_ij) g_j`` over each row's valid
    tokens, a token never attending to itself, computed within windows of ``window`` tokens.

    Rows whose valid tokens all lie within the first ``window`` steps attend over the whole
    row, whatever the padding beside them. Longer ones are cut into windows twice, at offsets
    0 and ``window // 2``, and each token takes its output from the cut in which it lies
    further from a window's edge (the first on ties): every token is covered, and sees at least
    ``window // 4`` tokens on each side that the row has. Each cut computes only the queries
    it owns (:func:`_owned_insides`, half of each window), against its window's every key, and
    only in the windows where one of them is a valid token (the others' outputs are zero).

    Args:
        g: ``[B, T, X]``. mask: ``[B, T]`` bool, the valid tokens.
        window: tokens per window. score: ``[b, i, X] x [b, j, X] -> [b, i, j]``.

    Returns:
        ``[B, T, X]``, zero at padded tokens and at a token alone in its window.
    """
    batch, steps, width = g.shape
    if steps <= window:
        return _attend(g, mask, score)
    # a row that fits in one window attends over all of itself, however far the batch that
    # holds it is padded: no row's output depends on the rows beside it
    fits = ~mask[:, window:].any(dim=1)  # [B]
    out = g.new_zeros(batch, steps, width)
    if fits.any():
        which = fits.nonzero().flatten()
        whole = _attend(g[which, :window], mask[which, :window], score)  # [S, window, X]
        out = out.index_copy(0, which, F.pad(whole, (0, 0, 0, steps - window)))
    if fits.all():
        return out
    which = (~fits).nonzero().flatten()
    rows = len(which)
    long_g, long_mask = g[which], mask[which]
    cuts = long_g.new_zeros(rows, steps, width)
    for offset, owned in zip((0, window // 2), _owned_insides(window, g.device), strict=True):
        if len(owned) == 0:
            continue
        blocks = -(-(steps + offset) // window)
        pad = blocks * window - steps - offset
        gp = F.pad(long_g, (0, 0, offset, pad)).reshape(rows * blocks, window, width)
        mp = F.pad(long_mask, (offset, pad)).reshape(rows * blocks, window)
        live = mp[:, owned].any(dim=1).nonzero().flatten()  # windows with a valid owned query
        part = _attend(gp[live], mp[live], score, owned)  # [live, |owned|, X]
        part = part.new_zeros(rows * blocks, len(owned), width).index_copy(0, live, part)
        full = part.new_zeros(rows * blocks, window, width).index_copy(1, owned, part)
        cuts = cuts + full.reshape(rows, blocks * window, width)[:, offset : offset + steps]
    return out.index_copy(0, which, cuts)


def _owned_insides(window: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """The places within a window whose tokens take their output from the cut at offset 0
    and from the cut at offset ``window // 2``: a token lies at ``i`` in the first cut's
    window and at ``(i + window // 2) % window`` in the second's, and goes to the cut where
    it is further from an edge, the first on ties. Each a 1-D int64 tensor."""
    place = torch.arange(window, device=device)

    def centrality(inside: Tensor) -> Tensor:
        return torch.minimum(inside, window - 1 - inside)

    half = window // 2
    first = centrality(place) >= centrality((place + half) % window)  # by the first cut's place
    second = centrality(place) > centrality((place - half) % window)  # by the second's
    return first.nonzero().flatten(), second.nonzero().flatten()


def _attend(
    g: Tensor,
    mask: Tensor,
    score: Callable[[Tensor, Tensor], Tensor],
    queries: Tensor | None = None,
) -> Tensor:
    """Attention of ``g [b, w, X]``'s tokens (those at ``queries`` only, when given) over the
    valid tokens of their row (``mask [b, w]``) but themselves -> ``[b, w or |queries|, X]``,
    zero at a padded query and at one with no other valid token."""
    steps = g.shape[1]
    eye = torch.eye(steps, dtype=torch.bool, device=g.device)
    if queries is not None:
        eye, query_mask, q = eye[queries], mask[:, queries], g[:, queries]
    else:
        query_mask, q = mask, g
    s = score(q, g)  # [b, i, w]
    keys = mask.unsqueeze(1) & ~eye  # [b, i, w]
    s = s.masked_fill(~keys, _MASKED)
    out = torch.bmm(torch.softmax(s, dim=-1), g)
    attends = query_mask & keys.any(dim=-1)  # a valid query with some other valid token
    return out * attends.unsqueeze(-1).to(out.dtype)


class DenseBlock(nn.Module):
    """MemoReader's dense encoder block: ``x [B, T, X] -> [B, T, 6h]``, ``[r_t; q_t]`` with
    ``p_t = ReLU(W x_t)`` (2h), ``r_t = BiGRU(p)_t`` (2h), the dense connection
    ``g_t = [r_t; p_t]`` and ``q_t`` the windowed trilinear self-attention over ``g`` (4h).

    With ``dense`` False (the ablation of ``--task.no-dense-connections``), ``g_t = r_t``: the
    attention sees the GRU's output alone and the block emits ``[B, T, 4h]``."""

    def __init__(
        self, input_size: int, hidden: int, window: int, dropout: float, dense: bool = True
    ) -> None:
        super().__init__()
        self.project = nn.Linear(input_size, 2 * hidden)
        self.rnn = _BiGRU(2 * hidden, hidden, dropout)
        self.dense = dense
        attended = 4 * hidden if dense else 2 * hidden
        self.score = Trilinear(attended)
        self.window = window
        self.output_size = 2 * hidden + attended

    def forward(self, x: Tensor, lengths: Tensor) -> Tensor:
        mask = _lengths_mask(lengths, x.shape[1])
        p = F.relu(self.project(x)) * mask.unsqueeze(-1).to(x.dtype)
        r = self.rnn(p, lengths)
        g = torch.cat([r, p], dim=-1) if self.dense else r
        q = windowed_self_attention(g, mask, self.window, self.score)
        return torch.cat([r, q], dim=-1)


class CoAttention(nn.Module):
    """BiDAF's attention flow: ``c [B, T, X]``, ``q [B, J, X]`` -> ``d [B, T, out]``,
    ``d_t = ReLU(W [c_t; c̃q_t; c_t ⊙ c̃q_t; c_t ⊙ c̃d])``."""

    def __init__(self, size: int, out: int) -> None:
        super().__init__()
        self.score = Trilinear(size)
        self.fuse = nn.Linear(4 * size, out)

    def forward(self, c: Tensor, c_mask: Tensor, q: Tensor, q_mask: Tensor) -> Tensor:
        s = self.score(c, q).masked_fill(~q_mask.unsqueeze(1), _MASKED)  # [B, T, J]
        to_question = torch.bmm(torch.softmax(s, dim=-1), q)  # [B, T, X]
        best = s.amax(dim=-1).masked_fill(~c_mask, _MASKED)  # [B, T]
        to_context = torch.bmm(torch.softmax(best, dim=-1).unsqueeze(1), c)  # [B, 1, X]
        fused = torch.cat([c, to_question, c * to_question, c * to_context], dim=-1)
        return F.relu(self.fuse(fused)) * c_mask.unsqueeze(-1).to(c.dtype)


class _PreEncoder(nn.Module):
    """A dense block projected back to the document's width, for a memory layer's
    ``pre_encoder`` (which passes no lengths: they are set on the module before each call)."""

    def __init__(self, size: int, o: ReaderOptions) -> None:
        super().__init__()
        self.block = DenseBlock(
            size, o.hidden_size, o.attention_window, o.dropout, o.dense_connections
        )
        self.out = nn.Linear(self.block.output_size, size)
        self.lengths: Tensor | None = None

    def forward(self, d: Tensor) -> Tensor:
        assert self.lengths is not None, "set lengths before the call"
        return self.out(self.block(d, self.lengths))


class DNCMemory(nn.Module):
    """MemoReader's memory controller (:class:`MemoryControllerLayer`) with its dense
    pre-encoder: ``d [B, T, D] -> o [B, T, D]``, residual to ``d``."""

    def __init__(self, size: int, o: ReaderOptions, config: Any) -> None:
        super().__init__()
        self.pre = _PreEncoder(size, o)
        self.layer = MemoryControllerLayer(
            size,
            memory_slots=config.memory_size,
            word_size=config.word_size,
            read_heads=config.num_read_heads,
            bidirectional=o.bidirectional_controller,
            pre_encoder=self.pre,
            batch_first=True,
            recompute_steps=config.recompute_steps or None,
        )

    def forward(self, d: Tensor, lengths: Tensor) -> tuple[Tensor, Any]:
        self.pre.lengths = lengths
        try:
            return self.layer(d, lengths=lengths)
        finally:
            self.pre.lengths = None


class CoreMemory(nn.Module):
    """A registered core in the memory controller's place: ``o_t = ReLU(W y_t + d_t)`` with
    ``y = core(pre(d))`` (the same dense pre-encoder), ``d [B, T, D] -> o [B, T, D]``."""

    def __init__(self, size: int, o: ReaderOptions, core: nn.Module) -> None:
        super().__init__()
        self.pre = _PreEncoder(size, o)
        self.core = core
        self.out = nn.Linear(core.output_size, size)

    def forward(self, d: Tensor, lengths: Tensor) -> tuple[Tensor, Any]:
        self.pre.lengths = lengths
        x = self.pre(d)
        self.pre.lengths = None
        y, state = self.core(x, None, lengths=lengths)
        mask = _lengths_mask(lengths, d.shape[1]).unsqueeze(-1).to(d.dtype)
        return F.relu(self.out(y) + d) * mask, state


class SpanHead(nn.Module):
    """Start and end scores over the document ``o [B, T, D]`` -> ``logits [B, 1 + T, 2]``
    (position 0: no answer, ``-inf`` unless ``no_answer``; padded tokens ``-inf``)."""

    def __init__(self, size: int, hidden: int, dropout: float, no_answer: bool) -> None:
        super().__init__()
        self.start_rnn = _BiGRU(size, hidden, dropout)
        self.end_rnn = _BiGRU(size + 2 * hidden, hidden, dropout)
        self.start = nn.Linear(size + 2 * hidden, 1)
        self.end = nn.Linear(size + 2 * hidden, 1)
        self.none = nn.Linear(4 * hidden, 2) if no_answer else None

    def forward(self, o: Tensor, lengths: Tensor) -> Tensor:
        mask = _lengths_mask(lengths, o.shape[1])
        m1 = self.start_rnn(o, lengths)
        m2 = self.end_rnn(torch.cat([o, m1], dim=-1), lengths)
        scores = torch.cat(
            [self.start(torch.cat([o, m1], dim=-1)), self.end(torch.cat([o, m2], dim=-1))],
            dim=-1,
        )  # [B, T, 2]
        scores = scores.float().masked_fill(~mask.unsqueeze(-1), float("-inf"))
        if self.none is None:
            null = scores.new_full((o.shape[0], 1, 2), float("-inf"))
        else:
            pooled = torch.cat([m1, m2], dim=-1).masked_fill(~mask.unsqueeze(-1), _MASKED)
            null = self.none(pooled.amax(dim=1)).float().unsqueeze(1)
        return torch.cat([null, scores], dim=1)


class Reader(nn.Module):
    """The reader: packed rows -> span logits (module docstring).

    Shapes:
        - inputs: ``[B, Q + T, 3 + C]`` int, ``3 + C + 1`` with ``paragraph_ranks`` (question
          block, then context; column 0 the word id, 0 for padding).
        - lengths: ``[B]`` int64, ``Q`` plus each context's steps (its tokens, and a windows
          row's gaps); None: through each row's last token.
        - returns ``(logits [B, 1 + T, 2], None)``; logits over every row's padded tokens are
          ``-inf``.
    """

    def __init__(self, o: ReaderOptions, memory: list[nn.Module]) -> None:
        super().__init__()
        self.options = o
        h = o.hidden_size
        self.embed = TokenEmbedding(o)
        self.encode = DenseBlock(
            self.embed.output_size, h, o.attention_window, o.dropout, o.dense_connections
        )
        self.attend = CoAttention(self.encode.output_size, 2 * h)
        self.memory = nn.ModuleList(memory)
        self.head = SpanHead(2 * h, h, o.dropout, o.no_answer)
        self.rank_prior: nn.Embedding | None = None
        if o.paragraph_ranks:  # rank 0 (question, padding) scores 0; the others start at 0
            self.rank_prior = nn.Embedding(o.paragraph_ranks + 1, 2, padding_idx=0)
            nn.init.zeros_(self.rank_prior.weight)

    def forward(
        self, inputs: Tensor, state: Any = None, lengths: Tensor | None = None
    ) -> tuple[Tensor, None]:
        q = self.options.question_block
        expected = self.embed.width + (self.rank_prior is not None)
        if inputs.dim() != 3 or inputs.shape[2] != expected:
            columns = f"3 + {self.options.chars} characters"
            columns += " + a paragraph rank" if self.rank_prior is not None else ""
            raise ValueError(
                f"the reader's inputs must be [B, steps, {expected}] ({columns}), got "
                f"{list(inputs.shape)}"
            )
        if lengths is None:  # through each row's last token (a windows row has gaps)
            steps = torch.arange(1, inputs.shape[1] - q + 1, device=inputs.device)
            lengths = q + ((inputs[:, q:, 0] != 0) * steps).amax(dim=1)
        lengths = lengths.to(inputs.device)
        rows = self.options.eval_rows
        if self.training or inputs.shape[0] <= rows:
            return self._read(inputs, lengths), None
        parts = [
            self._read(inputs[i : i + rows], lengths[i : i + rows])
            for i in range(0, inputs.shape[0], rows)
        ]
        steps = max(p.shape[1] for p in parts)
        padded = [F.pad(p, (0, 0, 0, steps - p.shape[1]), value=float("-inf")) for p in parts]
        return torch.cat(padded), None

    def _read(self, inputs: Tensor, lengths: Tensor) -> Tensor:
        q = self.options.question_block
        context_lengths = lengths - q
        steps = int(context_lengths.max())
        question_lengths = (inputs[:, :q, 0] != 0).sum(dim=1).clamp(min=1)
        question = inputs[:, : int(question_lengths.max())].long()
        context = inputs[:, q : q + steps].long()
        q_enc = self.encode(self.embed(question), question_lengths)
        q_mask = _lengths_mask(question_lengths, question.shape[1])
        if self.options.windows:
            logits = self._read_windows(context, context_lengths, q_enc, q_mask)
        else:
            logits = self._read_context(context, context_lengths, q_enc, q_mask)
        if self.rank_prior is None:
            return logits
        ranks = context[..., -1].clamp(max=self.options.paragraph_ranks)  # [B, T]
        prior = RANK_PRIOR_SCALE * self.rank_prior(ranks).to(logits.dtype)  # [B, T, 2]; padding 0
        return torch.cat([logits[:, :1], logits[:, 1:] + prior], dim=1)

    def _read_context(
        self, context: Tensor, context_lengths: Tensor, q_enc: Tensor, q_mask: Tensor
    ) -> Tensor:
        """``logits [B, 1 + T, 2]`` of the contexts ``context [B, T, 3 + C]`` (``[B]``
        lengths), each read in one pass beside its encoded question ``q_enc [B, Q', D]``."""
        c_enc = self.encode(self.embed(context), context_lengths)
        c_mask = _lengths_mask(context_lengths, context.shape[1])
        d = self.attend(c_enc, c_mask, q_enc, q_mask)
        for layer in self.memory:
            d, _ = layer(d, context_lengths)
        return self.head(d, context_lengths)

    def _read_windows(
        self, context: Tensor, context_lengths: Tensor, q_enc: Tensor, q_mask: Tensor
    ) -> Tensor:
        """:meth:`_read_context`'s logits with each window of a row (a run of tokens between
        padding steps, :func:`padding_windows`) read as a context of its own, beside its row's
        question, in :data:`WINDOW_GROUPS` groups of similar lengths; a row's "no answer"
        score is the best of its windows'."""
        rows, steps = context.shape[:2]
        row, first, length = padding_windows(context[..., 0], context_lengths)
        scores = q_enc.new_full((rows, steps, 2), float("-inf"), dtype=torch.float32)
        nulls = []  # [n, 2] each group's windows' "no answer" scores
        by_length = torch.argsort(length, stable=True)
        groups = by_length.tensor_split(min(WINDOW_GROUPS, len(by_length)))
        for group in groups:  # windows of similar lengths read together: little padding
            g_row, g_first, g_length = row[group], first[group], length[group]
            offsets = torch.arange(int(g_length.max()), device=context.device)
            inside = offsets < g_length.unsqueeze(1)  # [n, P]
            where = (g_first.unsqueeze(1) + offsets).clamp(max=steps - 1)  # [n, P] in the row
            windows = context[g_row.unsqueeze(1), where] * inside.unsqueeze(-1)  # padding 0
            logits = self._read_context(windows, g_length, q_enc[g_row], q_mask[g_row])
            at_row = g_row.unsqueeze(1).expand_as(where)
            scores = scores.index_put((at_row[inside], where[inside]), logits[:, 1:][inside])
            nulls.append(logits[:, 0])
        window_rows = row[by_length]  # the groups' windows in the order nulls holds them
        null = scores.new_full((rows, 2), float("-inf")).scatter_reduce(
            0, window_rows.unsqueeze(1).expand(-1, 2), torch.cat(nulls), "amax"
        )
        return torch.cat([null.unsqueeze(1), scores], dim=1)


def padding_windows(words: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The windows of each row of ``words [B, T]`` (0: padding) within its ``lengths [B]``:
    its runs of tokens between padding steps, row by row, left to right.

    Returns:
        ``(row [N], first [N], length [N])`` int64: each window's row, first step and tokens.
    """
    present = (words != 0) & _lengths_mask(lengths, words.shape[1])
    edge = present.new_zeros(present.shape[0], 1)
    begins = present & ~torch.cat([edge, present[:, :-1]], dim=1)
    ends = present & ~torch.cat([present[:, 1:], edge], dim=1)
    row, first = begins.nonzero(as_tuple=True)
    last = ends.nonzero(as_tuple=True)[1]  # row-major, as the begins: one end per begin
    return row, first, last - first + 1


@register_architecture(
    "reader",
    reads={
        "dnc": (
            ("memory_size", "word_size", "num_read_heads", "recompute_steps"),
            "its memory controller has one GRU layer as wide as the document, one write head "
            "and no clipping",
        )
    },
)
def build_reader(name: str, config: Any, head: Any, spec: TaskSpec) -> Reader:
    """The reader with the memory ``name`` names (``--model``): ``dnc`` the memory controller,
    ``none`` no memory, another core in the controller's place; ``spec.options['reader']``
    sizes it. ``head`` (the MLP head of last-step tasks) is not used."""
    o: ReaderOptions = spec.options["reader"]
    size = 2 * o.hidden_size
    entry = get_model(name)
    memory: list[nn.Module] = []
    for _ in range(o.memory_layers if name != "none" else 0):
        if name == "dnc":
            memory.append(DNCMemory(size, o, config))
        else:
            memory.append(CoreMemory(size, o, entry.build(config, size, None)))
    return Reader(o, memory)
