"""Extractive question answering on SQuAD-layout files (``relmem train squad``).

Each row is one question with its whole context (``relmem.tasks.reading.data``'s layout); the
reader scores every context token as the answer's start and end, and the predicted answer is
the best span of at most ``max_answer_tokens`` tokens (or "no answer", for data that has
unanswerable questions). The loss is the sum of the start's and the end's cross-entropy over
the whole context: one softmax over every window of a long document, the shared normalisation
of ``allenai/document-qa``. The metric is SQuAD's official F1 (and exact match), computed on
the predicted *text* against every reference answer (:mod:`relmem.tasks.reading.metric`),
reported overall and by context length (the groups).

A row's context is the question's own paragraph, or with ``--task.document article`` the
``--task.top-k`` paragraphs of its article that the ranker puts first, joined in article order
(:mod:`relmem.tasks.reading.articles`): a training row holds its own paragraph and the best
ranked others as distractors, a held-out row the best ranked whether or not its own is among
them. The softmax over the joined context is then the shared normalisation across the
paragraphs read. With ``--task.reading windows`` the row's paragraphs stand one padding step
apart and the reader reads each as its own window (``ReaderOptions.windows``: nothing it
computes crosses from one paragraph to the next), still under that one softmax: document-qa's
independent paragraphs with shared normalisation, beside MemoReader's single pass.

Data (``docs/reading.md`` §2): ``--data-dir DIR`` with ``train-v1.1.json`` and
``dev-v1.1.json`` (or the v2.0 names), or ``--task.train-file`` / ``--task.dev-file``, or
``--dataset squad | squad_v2`` (Hugging Face ``datasets``, online). With a train file alone,
``--task.held-out-articles F`` holds out that share of its articles, drawn by
``--task.split-seed``, as the evaluation set: what a user without the train file does with the
dev file.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import torch
import tyro
from torch import Tensor

from relmem.models.reader import ReaderOptions
from relmem.tasks.base import Batch, LazyRows, Measure, MetricSpec, Task, TaskSpec
from relmem.tasks.reading import sources
from relmem.tasks.reading.articles import (
    bonus_by_token,
    check_articles,
    held_out_paragraphs,
    rank_in_articles,
    ranks_in_row,
    training_paragraphs,
)
from relmem.tasks.reading.data import (
    EncodedSplit,
    Vocabulary,
    load_vocabulary,
    read_tokenized,
)
from relmem.tasks.reading.embeddings import read_word_vectors
from relmem.tasks.reading.metric import score_predictions, squad_scores
from relmem.tasks.reading.ranking import (
    DEFAULT_RANKER,
    RANKER_WEIGHT,
    Ranker,
    check_ranker_weight,
)
from relmem.tasks.registry import register_task
from relmem.validation import check_at_least

__all__ = ["Reading", "ReadingConfig", "best_spans"]

F1 = MetricSpec("f1", True, "F1", "f1", percent=True)
EXACT_MATCH = MetricSpec("exact_match", True, "exact match", "em", percent=True)
HAS_ANSWER_F1 = MetricSpec("has_answer_f1", True, "F1 on answerable questions", "hf1", True)
NO_ANSWER_F1 = MetricSpec("no_answer_f1", True, "F1 on unanswerable questions", "nf1", True)

# which rows a question's row comes from (targets[:, 3]): a training question; a held-out one
# as the run reads it; a held-out one read from its own paragraph alone (an article run's
# paragraph-level figure, ``more_held_out``)
TRAIN, HELD_OUT, OWN_PARAGRAPH = 0, 1, 2
# the paragraph ranks a rank prior tells apart when a row reads every paragraph (--task.top-k 0)
RANKS_OF_ALL = 8


@dataclass
class ReadingConfig:
    """The data, its layout and the reader's sizes (``--data-dir``, ``--task.*``).

    Attributes:
        data_dir: a folder with ``train-v1.1.json`` and ``dev-v1.1.json`` (or
            ``train-v2.0.json`` and ``dev-v2.0.json``); made absolute.
        dataset: 'squad' or 'squad_v2', fetched with Hugging Face ``datasets`` into
            ``$RELMEM_DATA`` (online, the ``data`` extra) when no files are given.
        train_file: the training file (overrides ``data_dir``'s).
        dev_file: the evaluation file (overrides ``data_dir``'s).
        held_out_articles: leave this share of the train file's articles (drawn by
            ``split_seed``) out of training and of the vocabulary; with no dev file, they are
            the evaluation set (with one, such as ``relmem eval --data``'s, they stay unused).
        split_seed: draws the held-out articles.
        test_size: evaluate on the first N held-out questions only (None: all).
        document: what a question's row reads: ``paragraph``, its own paragraph; ``article``,
            ``top_k`` paragraphs of its article ranked against it by ``ranker``, joined in article
            order: for training its own and the best ranked others, for evaluation the best
            ranked, its own among them or not (``docs/reading.md`` §7).
        top_k: with ``document`` article, the paragraphs a row reads (0: all of its
            article's); a training row leaves out the distractors that would take it past
            ``max_context_tokens``.
        reading: with ``document`` article, how the reader reads a row's paragraphs:
            ``joined``, in one pass, what it computed (the memory it wrote) carried from each
            paragraph into the next; ``windows``, each on its own, one padding step apart
            (``docs/reading.md`` §7). Either way one softmax spans every paragraph read.
        rank_prior: with ``document`` article, the reader also learns a start and an end
            score for each rank of a paragraph among its row's (the ranker's order; ranks past
            ``top_k`` share the last, 8 when ``top_k`` is 0), added to its tokens' scores: the
            ranker's word on which paragraph holds the answer, weighed beside the reader's own
            under the one softmax.
        ranker: what ranks an article's paragraphs against a question for the held-out
            rows, the choice among paragraphs and ``relmem answer`` (``docs/reading.md`` §6):
            ``bm25-proximity``, BM25+ over its content words and word pairs and how close its
            words stand, weighed as fit on SQuAD training articles; ``bm25``, BM25+ over its
            words (every run before 2026-11-29 ranked so, and a run whose config.json has no
            ``ranker`` reads and resumes so).
        training_ranker: what ranks them for the training rows: their distractors, their
            ranks for ``rank_prior`` and their bonus for ``ranker_in_loss``. ``bm25`` by
            default: readers trained on BM25+'s rows and read with ``bm25-proximity`` scored
            0.2-2.4 F1 higher on the held-out rows than readers trained on its own rows
            (three seeds; ``docs/results.md``, eighth round).
        ranker_weight: beta, what the ranker's word weighs when the answer is chosen among
            several paragraphs (a row of an article, or ``relmem answer``'s paragraphs): each
            span's score gains ``beta`` times its paragraph's ranker score less the best read
            paragraph's, ``log`` of the ranker's probability ``softmax(beta * score)`` up to
            a constant (``docs/reading.md`` §7); 0 leaves the reader's choice alone. Training
            is unchanged unless ``ranker_in_loss``.
        ranker_in_loss: with ``document`` article, the loss is taken on the reader's start
            scores plus that same bonus (weight ``ranker_weight``), so the reader learns what
            the ranker's word leaves to explain: the two experts trained as one product.
        embeddings: a GloVe-format text file (``word v1 .. vD`` per line, D = ``word_size``):
            the word vectors start there, and stay fixed (None: learned from scratch).
        min_word_count: training-file occurrences a word needs to get its own id.
        min_char_count: occurrences a character needs to get its own id.
        chars: characters per token the character CNN reads.
        question_tokens: Q, question tokens kept (longer ones are cut, and counted); at least 3.
        max_context_tokens: context tokens a *training* row keeps (None: all; evaluation
            always reads whole contexts).
        max_answer_tokens: the longest predicted span.
        word_size: the word vectors' width (the embeddings file's, when given).
        char_embedding: the character embedding's width.
        char_channels: the character CNN's filters.
        char_kernel: the character CNN's kernel width.
        hidden_size: h, units per GRU direction (the fused document is 2h wide).
        attention_window: the context's self-attention window, in tokens (stride half of it).
        memory_layers: stacked memory controllers (or cores) over the fused document.
        bidirectional_controller: the memory controller's GRU also reads backwards, feeding
            its output only (the forward GRU alone writes the memory).
        dropout: on the embeddings and every recurrent layer's input.
        dense_connections: each dense block's self-attention reads the GRU's input beside its
            output (MemoReader's dense connection, ``g_t = [r_t; p_t]``);
            ``--task.no-dense-connections`` drops it (``g_t = r_t``), the paper's ablation.
        length_buckets: context-length boundaries (tokens) of the by-length breakdown.
    """

    data_dir: Annotated[Path | None, tyro.conf.arg(aliases=("--data-dir",))] = None
    dataset: Annotated[
        Literal["squad", "squad_v2"] | None, tyro.conf.arg(aliases=("--dataset",))
    ] = None
    train_file: Path | None = None
    dev_file: Path | None = None
    held_out_articles: float | None = None
    split_seed: int = 0
    test_size: int | None = None
    document: Literal["paragraph", "article"] = "paragraph"
    top_k: int = 4
    reading: Literal["joined", "windows"] = "joined"
    rank_prior: bool = False
    ranker: Ranker = DEFAULT_RANKER
    training_ranker: Ranker = "bm25"
    # a run's config.json written before `ranker` existed ranked with bm25 throughout; one
    # written before `training_ranker` existed ranked its training rows with bm25 unless it ran
    # at git b9630b6-ea4ddbd (2026-11-29), which ranked them with `ranker`
    # (relmem.train.config.config_from_dict)
    OLDER_CONFIGS_MEANT: ClassVar[dict[str, Any]] = {"ranker": "bm25", "training_ranker": "bm25"}
    ranker_weight: float = RANKER_WEIGHT
    ranker_in_loss: bool = False
    embeddings: Path | None = None
    min_word_count: int = 1
    min_char_count: int = 5
    chars: int = 16
    question_tokens: int = 40
    max_context_tokens: int | None = 400
    # the reader's sizes: ReaderOptions' defaults (options() hands them over)
    max_answer_tokens: int = ReaderOptions.max_answer_tokens
    word_size: int = ReaderOptions.word_size
    char_embedding: int = ReaderOptions.char_embedding
    char_channels: int = ReaderOptions.char_channels
    char_kernel: int = ReaderOptions.char_kernel
    hidden_size: int = ReaderOptions.hidden_size
    attention_window: int = ReaderOptions.attention_window
    memory_layers: int = ReaderOptions.memory_layers
    bidirectional_controller: bool = ReaderOptions.bidirectional_controller
    dropout: float = ReaderOptions.dropout
    dense_connections: bool = ReaderOptions.dense_connections
    length_buckets: tuple[int, ...] = (100, 150, 200, 300)

    def __post_init__(self) -> None:
        for name in ("data_dir", "train_file", "dev_file", "embeddings"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, Path(value).expanduser().absolute())
        check_at_least(
            "task.",
            self,
            min_word_count=1,
            min_char_count=1,
            chars=1,
            question_tokens=3,  # rows stay at least 4 steps long: Batch.window keeps targets' 4
            max_answer_tokens=1,
            word_size=1,
            char_embedding=1,
            char_channels=1,
            char_kernel=1,
            hidden_size=1,
            attention_window=2,
            memory_layers=1,
            max_context_tokens=1,
            test_size=1,
            top_k=0,
        )
        if self.held_out_articles is not None and not 0 < self.held_out_articles < 1:
            raise ValueError(
                f"task.held_out_articles must lie in (0, 1), got {self.held_out_articles}"
            )
        if self.reading == "windows" and self.document != "article":
            raise ValueError(
                "task.reading windows reads each of a row's paragraphs on its own: it needs "
                "--task.document article (a paragraph row has one paragraph)"
            )
        if self.rank_prior and self.document != "article":
            raise ValueError(
                "task.rank_prior weighs the rank of each of a row's paragraphs: it needs "
                "--task.document article (a paragraph row has one paragraph)"
            )
        check_ranker_weight(self.ranker_weight, "task.ranker_weight")
        if self.ranker_in_loss and self.document != "article":
            raise ValueError(
                "task.ranker_in_loss adds the ranker's word on each of a row's paragraphs to "
                "the loss: it needs --task.document article (a paragraph row has one paragraph)"
            )
        if not 0 <= self.dropout < 1:
            raise ValueError(f"task.dropout must lie in [0, 1), got {self.dropout}")
        self.length_buckets = tuple(self.length_buckets)
        if list(self.length_buckets) != sorted(set(self.length_buckets)) or any(
            b < 1 for b in self.length_buckets
        ):
            raise ValueError(
                f"task.length_buckets must be increasing positive token counts, got "
                f"{self.length_buckets}"
            )

    def options(self, vocabulary: Vocabulary, no_answer: bool) -> ReaderOptions:
        """The reader's sizes as :class:`ReaderOptions`, for ``vocabulary``'s ids, with a
        "no answer" score when ``no_answer``; the word vectors start from ``embeddings``
        (read when the model is built) and stay fixed when it is given."""
        vectors = None
        if self.embeddings is not None:
            vectors = partial(read_word_vectors, self.embeddings, vocabulary, self.word_size)
        return ReaderOptions(
            vocab_size=vocabulary.size,
            char_vocab_size=vocabulary.char_size,
            question_block=self.question_tokens,
            chars=self.chars,
            word_size=self.word_size,
            char_embedding=self.char_embedding,
            char_channels=self.char_channels,
            char_kernel=self.char_kernel,
            hidden_size=self.hidden_size,
            attention_window=self.attention_window,
            memory_layers=self.memory_layers,
            bidirectional_controller=self.bidirectional_controller,
            dropout=self.dropout,
            dense_connections=self.dense_connections,
            max_answer_tokens=self.max_answer_tokens,
            no_answer=no_answer,
            windows=self.reading == "windows",
            paragraph_ranks=(self.top_k or RANKS_OF_ALL) if self.rank_prior else 0,
            freeze_words=self.embeddings is not None,
            word_vectors=vectors,
        )


class Reading(Task):
    """SQuAD-style reading: ``inputs [B, Q + T, 3 + C]`` packed rows, ``targets [B, 4]``
    (gold start and end token, -1 -1 when none; the question's index; its split),
    ``groups`` the context-length bucket, ``lengths`` Q + context tokens.

    Attributes:
        vocabulary: the training file's words and characters.
        train, held: the encoded files the training and evaluation questions come from (the
            same one when articles are held out).
        train_index, held_index: ``[N]`` int64 the questions of each split, in those files.
        contexts: by split (``TRAIN``, ``HELD_OUT``, and reading articles ``OWN_PARAGRAPH``),
            each question's row paragraphs (a list per question of that split's file, in
            reading order): its own paragraph, or its article's
            (:mod:`~relmem.tasks.reading.articles`).
        ranks: as ``contexts``, each row paragraph's rank among its row's (from 1, the best
            ranked; a question's own paragraph read alone is 1).
        ranker_scores: as ``contexts``, each row paragraph's ranker score for the question (0
            for a question's own paragraph read alone).
        context_tokens: by split, ``[N]`` int64 each question's row context tokens (before
            ``max_context_tokens`` cuts a training row).
    """

    metric = F1
    keep_best = True
    fresh_batches = False  # training questions are all there is besides the held-out ones
    group_name = "context length"

    def __init__(self, config: ReadingConfig) -> None:
        self.config = config
        # padding steps between a row's paragraphs: a window reader's boundaries
        self.gap = 1 if config.reading == "windows" else 0
        train_path, dev_path = sources.resolve(config)
        train_text = read_tokenized(train_path)
        if config.document == "article":
            check_articles(train_text.squad, config.top_k)
        held_articles: set[str] = set()
        if config.held_out_articles is not None:
            held_articles = sources.held_out_articles(
                train_text.squad, config.held_out_articles, config.split_seed
            )
        vocabulary_text = sources.without_articles(train_text, held_articles)
        self.vocabulary: Vocabulary = load_vocabulary(
            vocabulary_text, config.min_word_count, config.min_char_count
        )
        self.train = EncodedSplit(train_text, self.vocabulary, config.chars)
        self.held = (
            self.train
            if dev_path is None
            else EncodedSplit(read_tokenized(dev_path), self.vocabulary, config.chars)
        )
        in_held = torch.tensor([t in held_articles for t in self.train.squad.titles])
        paragraphs = torch.tensor([q.paragraph for q in self.train.squad.questions])
        usable = (self.train.gold[:, 0] >= 0) | ~torch.tensor(
            [q.answerable for q in self.train.squad.questions]
        )
        self.train_index = torch.nonzero(~in_held[paragraphs] & usable).flatten()
        if dev_path is None:
            self.held_index = torch.nonzero(in_held[paragraphs]).flatten()
        else:
            self.held_index = torch.arange(len(self.held))
        if config.test_size is not None:
            self.held_index = self.held_index[: config.test_size]
        if not len(self.train_index):
            raise ValueError(f"{train_path}: no training question has an aligned answer")
        self.contexts, self.ranks, self.ranker_scores = {}, {}, {}
        for split, encoded, index in (
            (TRAIN, self.train, self.train_index),
            (HELD_OUT, self.held, self.held_index),
        ):
            rows = self._row_paragraphs(encoded, index, training=split == TRAIN)
            self.contexts[split], self.ranks[split], self.ranker_scores[split] = rows
        if config.document == "article":
            self.contexts[OWN_PARAGRAPH] = [[q.paragraph] for q in self.held.squad.questions]
            self.ranks[OWN_PARAGRAPH] = [[1]] * len(self.held)
            self.ranker_scores[OWN_PARAGRAPH] = [[0.0]] * len(self.held)
        self.context_tokens = {
            split: self._encoded(split).joined_tokens(contexts, self.gap)
            for split, contexts in self.contexts.items()
        }
        lengths = self.context_tokens[TRAIN][self.train_index]
        self._by_length = self.train_index[torch.argsort(lengths, stable=True)]
        trains_no_answer = any(not q.answerable for q in self.train.squad.questions)
        held_no_answer = sum(
            not self.held.squad.questions[i].answerable for i in self.held_index.tolist()
        )
        if held_no_answer and not trains_no_answer:
            raise ValueError(
                f"{dev_path}: {held_no_answer:,} of its {len(self.held_index):,} questions are "
                f"unanswerable (SQuAD v2.0), but the training file {train_path} has none, so "
                'the reader has no "no answer" output and would score 0 on every one of them: '
                "evaluate on a file whose questions all have answers (v1.1), or train on data "
                "with unanswerable questions (train-v2.0.json)"
            )
        self.unanswerable = trains_no_answer
        self.extra_metrics = (EXACT_MATCH,) + (
            (HAS_ANSWER_F1, NO_ANSWER_F1) if self.unanswerable else ()
        )
        self.num_groups = len(config.length_buckets) + 1
        print(self.describe(), file=sys.stderr)
        longest = int(self.context_tokens[HELD_OUT][self.held_index].max())
        self.spec = TaskSpec(
            input_size=self.vocabulary.size,
            seq_len=config.question_tokens + longest,
            output_size=2,
            output="span",
            encoding="reader",
            architecture="reader",
            options={"reader": config.options(self.vocabulary, self.unanswerable)},
        )

    def _row_paragraphs(
        self, encoded: EncodedSplit, index: Tensor, training: bool
    ) -> tuple[list[list[int]], list[list[int]], list[list[float]]]:
        """The paragraphs of each question's row, a list per question of ``encoded``: its own
        paragraph, or with ``document`` article (for the questions ``index [N]``) those of its
        article ranked against it (:func:`~relmem.tasks.reading.articles.training_paragraphs`
        when ``training``, else :func:`~relmem.tasks.reading.articles.held_out_paragraphs`);
        and, as those lists, each paragraph's rank among its row's (from 1) and its ranker
        score (0 for a paragraph read alone)."""
        questions = encoded.squad.questions
        contexts = [[q.paragraph] for q in questions]
        ranks = [[1] for _ in questions]
        scores = [[0.0] for _ in questions]
        if self.config.document == "paragraph":
            return contexts, ranks, scores
        top_k, most = self.config.top_k, self.config.max_context_tokens
        ranker = self.config.training_ranker if training else self.config.ranker
        for i, ranked in rank_in_articles(encoded.squad, index.tolist(), ranker).items():
            own, order = questions[i].paragraph, ranked.paragraphs
            contexts[i] = (
                training_paragraphs(order, own, top_k, encoded.sizes, most, self.gap)
                if training
                else held_out_paragraphs(order, top_k)
            )
            ranks[i] = ranks_in_row(order, contexts[i])
            score = dict(zip(order, ranked.scores, strict=True))
            scores[i] = [score[p] for p in contexts[i]]
        return contexts, ranks, scores

    def describe(self) -> str:
        """One line on the data: each file's alignment counts, the questions of each split
        and, reading articles, the paragraphs a row reads and how often a held-out row holds
        its question's own paragraph."""
        q = self.config.question_tokens
        files = [self.train] if self.held is self.train else [self.train, self.held]
        parts = []
        for encoded in files:
            stats = encoded.stats(q)
            parts.append(
                f"{encoded.squad.path.name}: {stats.answers:,} answers ({stats.unaligned} not "
                f"aligned, {stats.inexact} starting or ending inside a token), "
                f"{stats.truncated_questions} questions cut to {q} tokens"
            )
        parts.append(
            f"{len(self.train_index):,} training questions, {len(self.held_index):,} held-out"
        )
        if self.config.document == "article":
            parts.append(self._describe_articles())
        return "relmem: squad: " + "; ".join(parts)

    def _describe_articles(self) -> str:
        """The paragraphs per row of each split, and the held-out rows' recall of their
        question's own paragraph (answerable questions)."""
        train = [len(self.contexts[TRAIN][i]) for i in self.train_index.tolist()]
        held = [len(self.contexts[HELD_OUT][i]) for i in self.held_index.tolist()]
        questions = self.held.squad.questions
        answerable = [i for i in self.held_index.tolist() if questions[i].answerable]
        found = sum(questions[i].paragraph in self.contexts[HELD_OUT][i] for i in answerable)
        recall = f"{found / len(answerable):.1%}" if answerable else "n/a"
        read = "all" if self.config.top_k == 0 else f"the {self.config.top_k} best"
        return (
            f"articles ({self.config.reading}; held-out rows {self.config.ranker} ranked, "
            f"training rows {self.config.training_ranker}): {read} paragraphs a row, "
            f"{sum(train) / len(train):.2f} a training row (own + distractors within "
            "max_context_tokens), "
            f"{sum(held) / max(len(held), 1):.2f} a held-out row, holding the question's own "
            f"for {recall} of the answerable"
        )

    # -- batches ---------------------------------------------------------------------------

    def _batch(self, split: int, index: Tensor, max_context: int | None) -> Batch:
        encoded, read = self._encoded(split), self.contexts[split]
        picked = index.tolist()
        contexts = [read[i] for i in picked]
        ranks = [self.ranks[split][i] for i in picked] if self.config.rank_prior else None
        inputs, lengths, gold = encoded.rows(
            index, self.config.question_tokens, max_context, contexts, self.gap, ranks
        )
        targets, groups = self._targets_and_groups(split, index, gold)
        return Batch(inputs, targets, groups, None, lengths)

    def _targets_and_groups(self, split: int, index: Tensor, gold: Tensor) -> tuple[Tensor, Tensor]:
        """``targets [B, 4]`` (gold start and end, question index, split) and the context-length
        group of each question ``index [B]``."""
        targets = torch.cat(
            [gold, index.unsqueeze(1), torch.full_like(index, split).unsqueeze(1)], dim=1
        )
        context = self.context_tokens[split][index]
        groups = torch.bucketize(context, torch.tensor(self.config.length_buckets), right=True)
        return targets, groups

    def sample(self, batch_size: int, generator: torch.Generator, step: int = 0) -> Batch:
        """``batch_size`` training questions of similar context lengths: the training
        questions sorted by context length are cut into buckets of ``8 · batch_size``; a
        position drawn uniformly picks the bucket (so a bucket is drawn in proportion to its
        size, and every question is equally likely), then the rows are drawn uniformly from
        it, with replacement. Similar lengths waste less compute on padding."""
        device = generator.device
        count = len(self.train_index)
        ordered = self._by_length
        size = min(8 * batch_size, count)
        position = int(torch.randint(count, (1,), generator=generator, device=device))
        first = min(position // size * size, max(count - size, 0))
        last = count if first + 2 * size > count else first + size  # the tail joins the last
        draw = torch.randint(last - first, (batch_size,), generator=generator, device=device)
        index = ordered[first + draw.cpu()]
        return self._batch(TRAIN, index, self.config.max_context_tokens).to(device)

    def held_out(self, device: torch.device) -> LazyRows:
        """Every held-out question (or the first ``test_size``), shortest context first, whole
        contexts; padded a chunk at a time (one long context would otherwise pad every row)."""
        return self._held_out_rows(HELD_OUT, device)

    def more_held_out(self, device: torch.device) -> dict[str, LazyRows]:
        """Reading articles: the same held-out questions each read from its own paragraph
        alone, ``'paragraph-level'`` (what the run scores when handed the right paragraph,
        beside :meth:`held_out`'s article rows); nothing more for a paragraph run."""
        if self.config.document == "paragraph":
            return {}
        return {"paragraph-level": self._held_out_rows(OWN_PARAGRAPH, device)}

    def _held_out_rows(self, split: int, device: torch.device) -> LazyRows:
        """The held-out questions' rows of ``split`` (``HELD_OUT`` or ``OWN_PARAGRAPH``), as
        :meth:`held_out` describes."""
        index = self.held_index
        tokens = self.context_tokens[split]
        index = index[torch.argsort(tokens[index], stable=True)]
        contexts = [self.contexts[split][i] for i in index.tolist()]
        gold = self.held.row_gold(index, contexts, gap=self.gap)
        targets, groups = self._targets_and_groups(split, index, gold)
        lengths = tokens[index] + self.config.question_tokens

        def build(rows: Tensor) -> Batch:
            return self._batch(split, index[rows.cpu()], None).to(device)

        return LazyRows(targets.to(device), groups.to(device), lengths.to(device), build)

    # -- scores ----------------------------------------------------------------------------

    def measure(self, logits: Tensor, batch: Batch) -> dict[str, Measure]:
        """Per question: the start and end cross-entropy (0 for a question whose answer did
        not align: it is still scored), and the official F1 and exact match of the predicted
        text."""
        logits = logits.float()
        segments = self._segments(batch, logits.shape[1] - 1).to(logits.device)
        in_loss = self.config.ranker_in_loss  # else the bonus needs no gradient
        ranked = self._with_ranker(logits if in_loss else logits.detach(), batch, segments)
        gold = batch.targets[:, :2]
        target = torch.where(gold >= 0, gold + 1, torch.zeros_like(gold))  # 0: no answer
        trainable = (gold[:, 0] >= 0) | ~self._answerable(batch)
        trained = ranked if in_loss else logits
        xent = torch.nn.functional.cross_entropy(trained, target, reduction="none").sum(dim=1)
        loss = torch.where(trainable, xent, torch.zeros_like(xent))  # [B]
        texts = self._texts(ranked.detach(), batch, segments)
        scores = [
            squad_scores(text, self._question(batch, row).answers) for row, text in enumerate(texts)
        ]
        em = torch.tensor([s[0] for s in scores], dtype=torch.float64, device=logits.device)
        f1 = torch.tensor([s[1] for s in scores], dtype=torch.float64, device=logits.device)
        measures = {
            "loss": Measure.per_example(loss),
            "f1": Measure.per_example(f1),
            "exact_match": Measure.per_example(em),
        }
        if self.unanswerable:
            has = self._answerable(batch).to(f1.dtype)
            measures["has_answer_f1"] = Measure(f1 * has, has)
            measures["no_answer_f1"] = Measure(f1 * (1 - has), 1 - has)
        return measures

    def _answerable(self, batch: Batch) -> Tensor:
        flags = [self._question(batch, row).answerable for row in range(batch.size)]
        return torch.tensor(flags, dtype=torch.bool, device=batch.targets.device)

    def _encoded(self, split: int) -> EncodedSplit:
        return self.train if split == TRAIN else self.held

    def _question(self, batch: Batch | LazyRows, row: int) -> Any:
        split, index = int(batch.targets[row, 3]), int(batch.targets[row, 2])
        return self._encoded(split).squad.questions[index]

    def predicted_texts(self, logits: Tensor, batch: Batch) -> list[str]:
        """The answer text of each row of ``logits [B, 1 + T, 2]`` ("" for no answer): the
        best span within one paragraph of the row's context, cut from that paragraph, each
        span's score with its paragraph's ranker bonus (``ranker_weight``)."""
        segments = self._segments(batch, logits.shape[1] - 1).to(logits.device)
        return self._texts(self._with_ranker(logits.detach(), batch, segments), batch, segments)

    def _with_ranker(self, logits: Tensor, batch: Batch, segments: Tensor) -> Tensor:
        """``logits [B, 1 + T, 2]`` with each start score plus its paragraph's ranker bonus
        (``ranker_weight``; ``segments [B, T]``, each token's paragraph in its row): on the
        start alone, so that a span's score gains it once."""
        scores = [
            self.ranker_scores[int(batch.targets[row, 3])][int(batch.targets[row, 2])]
            for row in range(batch.size)
        ]
        bonus = bonus_by_token(segments, scores, self.config.ranker_weight)  # [B, T]
        start = torch.cat([logits[:, :1, 0], logits[:, 1:, 0] + bonus.to(logits.dtype)], dim=1)
        return torch.stack([start, logits[..., 1]], dim=-1)

    def _texts(self, scores: Tensor, batch: Batch, segments: Tensor) -> list[str]:
        """The answer text of each row's best span under ``scores [B, 1 + T, 2]`` (the
        ranker's bonus already in), as :meth:`predicted_texts`."""
        first, last, _ = best_spans(scores, self.config.max_answer_tokens, segments)
        texts = []
        for row in range(batch.size):
            if first[row] < 0:
                texts.append("")
                continue
            split, index = int(batch.targets[row, 3]), int(batch.targets[row, 2])
            paragraphs = self.contexts[split][index]
            found = self._encoded(split).answer_text(
                index, int(first[row]), int(last[row]), paragraphs, self.gap
            )
            texts.append(found[0])
        return texts

    def _segments(self, batch: Batch, steps: int) -> Tensor:
        """``[B, steps]`` int64: each context token's paragraph in its row's context (-1 past
        its end), for :func:`best_spans`."""
        segments = torch.full((batch.size, steps), -1, dtype=torch.int64)
        for row in range(batch.size):
            split, index = int(batch.targets[row, 3]), int(batch.targets[row, 2])
            mine = self._encoded(split).segments(self.contexts[split][index], self.gap)[:steps]
            segments[row, : len(mine)] = mine
        return segments

    def predictions(self, logits: Tensor, batch: Batch) -> dict[str, str]:
        """``{question id: predicted answer}`` of the reader's ``logits`` on ``batch`` (the
        official predictions file's content)."""
        texts = self.predicted_texts(logits, batch)
        return {self._question(batch, row).qid: text for row, text in enumerate(texts)}

    def report(
        self, predictions: dict[str, str], batch: Batch | LazyRows
    ) -> dict[str, dict[str, float]]:
        """The official figures of ``predictions`` on ``batch``'s questions, overall and by
        context length: ``{'all': {...}, group label: {...}}`` (each
        :func:`~relmem.tasks.reading.metric.score_predictions`' output)."""
        groups: dict[str, dict[str, list[str]]] = {"all": {}}
        for row in range(batch.size):
            question = self._question(batch, row)
            label = self.group_label(int(batch.groups[row]))
            groups["all"][question.qid] = list(question.answers)
            groups.setdefault(label, {})[question.qid] = list(question.answers)
        ordered = ["all"] + [self.group_label(g) for g in range(self.num_groups)]
        return {k: score_predictions(groups[k], predictions) for k in ordered if k in groups}

    def group_label(self, group: int) -> str:
        """``'100-149 tokens'``, ``'300+ tokens'``."""
        edges = (0, *self.config.length_buckets)
        if group + 1 < len(edges):
            return f"{edges[group]}-{edges[group + 1] - 1} tokens"
        return f"{edges[-1]}+ tokens"

    def data_identity(self) -> dict[str, Any]:
        """The vocabulary (tokenizer, sizes, SHA-1 of its entries): what the ids mean; and,
        reading articles, ``document`` and ``top_k`` (and ``reading``, read as windows;
        ``rank_prior``, the rows carrying their paragraphs' ranks): what the rows held (a
        paragraph-level run's identity stays what runs recorded before articles were read)."""
        identity: dict[str, Any] = {"vocabulary": self.vocabulary.identity()}
        if self.config.document == "article":
            identity |= {"document": self.config.document, "top_k": self.config.top_k}
        if self.config.reading == "windows":
            identity["reading"] = self.config.reading
        if self.config.rank_prior:
            identity["rank_prior"] = True
        return identity

    def export_vocabulary(self) -> dict[str, list[str]]:
        """Words and characters in id order (ids 0 and 1 are padding and unknown)."""
        return self.vocabulary.exported()


def best_spans(
    logits: Tensor, max_tokens: int, segments: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """The best answer of each row of ``logits [B, 1 + T, 2]``: the span ``first <= last <
    first + max_tokens`` maximising ``start[first] + end[last]`` over the context positions,
    or "no answer" (position 0's start + end) when that scores higher. With ``segments [B,
    T]`` (each context token's paragraph, non-decreasing along a row, -1 for padding), a span
    lies within one paragraph: none runs from one paragraph of a joined context into the next,
    or into padding.

    Returns:
        ``(first [B], last [B], score [B])``: context token indices (-1 -1 for no answer) and
        the winning score.
    """
    logits = logits.detach()
    start, end = logits[:, 1:, 0], logits[:, 1:, 1]  # [B, T]
    steps = start.shape[1]
    best = torch.full_like(start[:, 0], float("-inf"))
    first = torch.zeros_like(best, dtype=torch.long)
    width = torch.zeros_like(first)
    for k in range(min(max_tokens, steps)):
        scores = start[:, : steps - k] + end[:, k:]  # [B, T - k]: spans of k + 1 tokens
        if segments is not None:
            outside = (segments[:, : steps - k] != segments[:, k:]) | (segments[:, k:] < 0)
            scores = scores.masked_fill(outside, float("-inf"))
        value, where = scores.max(dim=1)
        better = value > best
        best = torch.where(better, value, best)
        first = torch.where(better, where, first)
        width = torch.where(better, torch.full_like(width, k), width)
    null = logits[:, 0, 0] + logits[:, 0, 1]
    none = null > best
    first = torch.where(none, torch.full_like(first, -1), first)
    last = torch.where(none, torch.full_like(first, -1), first + width)
    return first, last, torch.where(none, null, best)


@register_task("squad", ReadingConfig)
def build_reading(config: ReadingConfig) -> Reading:
    return Reading(config)
