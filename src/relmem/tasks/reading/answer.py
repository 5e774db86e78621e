"""Answering questions about any text with a trained reader (``relmem answer``, or in Python
:func:`answer` / :func:`load_reader`)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import Tensor
from tqdm import tqdm

from relmem.tasks.base import row_chunks
from relmem.tasks.reading.data import EncodedSplit, Vocabulary, tokenized
from relmem.tasks.reading.ranking import Paragraph, ParagraphIndex, ranker_bonus, split_paragraphs
from relmem.tasks.reading.squad import Question, SquadFile, lone_surrogate
from relmem.tasks.reading.task import Reading, ReadingConfig

__all__ = ["Answer", "AnswerReader", "answer", "load_reader"]

# the progress bar of a long read: shown after this many seconds, redrawn this often
PROGRESS_AFTER_S = 2.0
PROGRESS_EVERY_S = 1.0
# paragraphs per forward pass (fewer where their rows pass row_chunks' token budget)
CHUNK_ROWS = 64
# the paragraphs read per question, the best ranked (relmem answer --paragraphs)
PARAGRAPHS = 4


@dataclass(frozen=True)
class Answer:
    """A reader's answer to one question.

    Attributes:
        question: the question asked.
        text: the answer, exactly as it stands in the context ("" for "no answer").
        start, end: its character offsets (``context[start:end] == text``; -1 -1 for none).
        probability: the reader's probability of this span (its start's softmax times its
            end's, over every position of every paragraph read and "no answer").
        paragraph: the index of the paragraph it stands in, in
            :func:`~relmem.tasks.reading.ranking.split_paragraphs` of the context (-1 for
            none).
        line: the line of the context (from 1) on which it starts (0 for none).
        score: the reader's start plus end score for it (comparable across the paragraphs of
            one question, as the reader was trained with one softmax over a whole context),
            plus its paragraph's ranker bonus: ``ranker_weight`` times the paragraph's ranker
            score less the best ranked one's (0 in the best ranked paragraph).
        alternatives: with ``top`` N, the N - 1 next best answers, best first: each another
            text, and no two overlapping in one paragraph.
    """

    question: str
    text: str
    start: int
    end: int
    probability: float
    paragraph: int = 0
    line: int = 1
    score: float = 0.0
    alternatives: tuple[Answer, ...] = ()


class AnswerReader:
    """A trained reader ready to answer: ``reader(context, question) -> Answer``.

    A context is cut into paragraphs (blank-line separated, long ones into windows of at most
    :data:`~relmem.tasks.reading.ranking.MAX_TOKENS` tokens), ranked against each question by
    its ``config.ranker``, and the best few read, each as its own context (with its rank, for
    a reader trained with a rank prior), in one batch; the answer is the best span over all
    of them.

    Args:
        vocabulary: the words and characters it was trained with (what its ids mean).
        config: its task's configuration (the character width, question block and longest
            answer).
        model: the reader.
    """

    def __init__(
        self, vocabulary: Vocabulary, config: ReadingConfig, model: torch.nn.Module
    ) -> None:
        self.vocabulary, self.config, self.model = vocabulary, config, model.eval()

    @torch.no_grad()
    def __call__(
        self,
        context: str,
        questions: str | list[str],
        progress: bool = False,
        *,
        paragraphs: int = PARAGRAPHS,
        top: int = 1,
    ) -> Answer | list[Answer]:
        """The best span of ``context`` for each question (a list for a list), the questions'
        paragraphs read a chunk of rows at a time.

        Args:
            progress: show a progress bar on stderr once answering has taken
                :data:`PROGRESS_AFTER_S` seconds.
            paragraphs: read the question's ``paragraphs`` best ranked paragraphs (0: all; a
                paragraph that repeats an earlier one is read once).
            top: each answer holds the ``top - 1`` next best as its ``alternatives``.

        Raises:
            ValueError: the context or a question is empty, or holds a lone surrogate (not
                Unicode text: bytes that were not UTF-8); ``paragraphs`` is negative or
                ``top`` less than 1.
        """
        asked = [questions] if isinstance(questions, str) else list(questions)
        if not context.strip():
            raise ValueError("the context is empty")
        if not asked:
            raise ValueError("no question asked")
        if paragraphs < 0:
            raise ValueError(f"paragraphs is {paragraphs}: read at least 1 (0 reads them all)")
        if top < 1:
            raise ValueError(f"top is {top}: ask for at least the best answer (1)")
        check_text("the context", context)
        for number, question in enumerate(asked, 1):
            if not question.strip():
                raise ValueError(f"question {number} is empty")
            check_text(f"question {number}", question)
        parts = split_paragraphs(context)
        index = ParagraphIndex([p.text for p in parts], self.config.ranker)
        ranked = [index.ranked(question, paragraphs) for question in asked]
        chosen = [picked for picked, _ in ranked]  # [questions][k]
        read = sorted({i for picked in chosen for i in picked})  # paragraphs read, in order
        slot = {p: s for s, p in enumerate(read)}
        rows = [
            Question(str(q), asked[q], slot[p], (), ())
            for q, picked in enumerate(chosen)
            for p in picked
        ]
        squad = SquadFile(Path("<asked>"), [parts[p].text for p in read], [""] * len(read), rows)
        encoded = EncodedSplit(tokenized(squad), self.vocabulary, self.config.chars)
        lengths = encoded.context_tokens + self.config.question_tokens
        order = torch.argsort(lengths, stable=True)  # by length: rows in a chunk pad little
        device = next(self.model.parameters()).device
        logits: list[Tensor] = [torch.empty(0)] * len(rows)  # each row's [1 + T_row, 2]
        bar = tqdm(
            total=len(rows),
            desc=f"reading {int(encoded.context_tokens.sum()):,} tokens",
            unit="paragraph",
            delay=PROGRESS_AFTER_S,
            disable=not progress,
            leave=False,
        )
        # each row's paragraph's rank among the question's (read only by a rank prior)
        ranks = [[k + 1] for picked in chosen for k in range(len(picked))]
        with bar, ticking(bar, PROGRESS_AFTER_S, PROGRESS_EVERY_S):
            for part in row_chunks(order, lengths, CHUNK_ROWS):
                inputs, part_lengths, _ = encoded.rows(
                    part,
                    self.config.question_tokens,
                    None,
                    ranks=[ranks[i] for i in part.tolist()] if self.config.rank_prior else None,
                )
                out, _ = self.model(inputs.to(device), None, lengths=part_lengths.to(device))
                for row, i in enumerate(part.tolist()):
                    steps = 1 + int(encoded.context_tokens[i])
                    logits[i] = out[row, :steps].float().cpu()
                bar.update(len(part))
        answers, first = [], 0
        for q, picked in enumerate(chosen):
            mine = range(first, first + len(picked))
            first += len(picked)
            bonus = ranker_bonus(ranked[q][1], self.config.ranker_weight)
            found = self._ranked(encoded, [logits[r] for r in mine], list(mine), top, bonus)
            located = [self._located(a, asked[q], picked, parts, context) for a in found]
            answers.append(replace(located[0], alternatives=tuple(located[1:])))
        return answers[0] if isinstance(questions, str) else answers

    def _ranked(
        self,
        encoded: EncodedSplit,
        logits: list[Tensor],
        rows: list[int],
        top: int,
        bonus: list[float],
    ) -> list[tuple[int, int, int, float, float]]:
        """One question's ``top`` best answers from its paragraphs' ``logits [1 + T_r, 2]``
        (rows ``rows`` of ``encoded``), each span's score with its paragraph's ``bonus``
        (:func:`~relmem.tasks.reading.ranking.ranker_bonus`), best first: ``(r, start, end,
        score, probability)``, ``r`` the position in ``rows`` (-1 -1 -1 for "no answer"),
        ``start, end`` character offsets in that paragraph, ``probability`` the reader's own;
        texts distinct, spans of one paragraph disjoint."""
        every = torch.cat(logits)  # [sum(1 + T_r), 2]: one softmax over all of them
        norm = torch.logsumexp(every, dim=0)  # [2]
        spans = []
        for r, row_logits in enumerate(logits):
            for i, j, score in top_spans(row_logits, self.config.max_answer_tokens, top):
                spans.append((score + bonus[r], r, i, j))
        nulls = torch.stack([row[0].sum() for row in logits])  # [R]
        null_row = int(nulls.argmin())  # no answer only where every paragraph says so
        candidates = sorted(spans, key=lambda c: -c[0])
        null = float(nulls[null_row])
        if null > float("-inf"):
            place = sum(1 for c in candidates if c[0] >= null)
            candidates.insert(place, (null, null_row, -1, -1))
        found: list[tuple[int, int, int, float, float]] = []
        texts: set[str] = set()
        for score, r, i, j in candidates:
            row_logits = logits[r]
            log_p = row_logits[i + 1, 0] - norm[0] + row_logits[j + 1, 1] - norm[1]
            if i < 0:
                text, start, end, r = "", -1, -1, -1
            else:
                text, start, end = encoded.answer_text(rows[r], i, j)
            if text in texts:
                continue
            texts.add(text)
            found.append((r, start, end, score, float(log_p.exp())))
            if len(found) == top:
                break
        return found

    @staticmethod
    def _located(
        found: tuple[int, int, int, float, float],
        question: str,
        picked: list[int],
        parts: list[Paragraph],
        context: str,
    ) -> Answer:
        """``found`` (from :meth:`_ranked`) as an :class:`Answer` placed in the whole
        ``context``: its offsets, paragraph and line."""
        r, start, end, score, probability = found
        if r < 0:
            return Answer(question, "", -1, -1, probability, -1, 0, score)
        part = parts[picked[r]]
        line = part.line + part.text.count("\n", 0, start)
        at = part.start + start
        return Answer(
            question, context[at : part.start + end], at, part.start + end, probability,
            picked[r], line, score,
        )  # fmt: skip


def top_spans(logits: Tensor, max_tokens: int, n: int) -> list[tuple[int, int, float]]:
    """The ``n`` best spans of one row's ``logits [1 + T, 2]`` (position 0 "no answer"),
    pairwise disjoint, best first: ``(first, last, start[first] + end[last])`` with context
    token indices ``first <= last < first + max_tokens``; fewer where fewer are finite."""
    start, end = logits[1:, 0], logits[1:, 1]  # [T]
    steps = start.shape[0]
    width = min(max_tokens, steps)
    ends = torch.arange(steps).unsqueeze(1) + torch.arange(width)  # [T, W]: first + k
    scores = start.unsqueeze(1) + end[ends.clamp(max=steps - 1)]  # [T, W]
    scores = scores.masked_fill(ends >= steps, float("-inf")).flatten()
    # a span overlaps at most 2 W^2 others: the first n (2 W^2 + 1) spans hold n disjoint ones
    count = min(scores.numel(), n * (2 * width * width + 1))
    values, where = scores.topk(count)
    picked: list[tuple[int, int, float]] = []
    for value, flat in zip(values.tolist(), where.tolist(), strict=True):
        if value == float("-inf") or len(picked) == n:
            break
        first, last = flat // width, flat // width + flat % width
        if all(last < a or first > b for a, b, _ in picked):
            picked.append((first, last, value))
    return picked


def check_text(what: str, text: str) -> None:
    """Refuse ``text`` (``what`` names it) when it holds a lone surrogate.

    Raises:
        ValueError: naming where, and that the bytes it came from were not UTF-8.
    """
    at = lone_surrogate(text)
    if at is not None:
        raise ValueError(
            f"{what} holds {ascii(text[at])} at character {at}, which is not Unicode text (a "
            "byte that is not UTF-8, or half of a surrogate pair): pass UTF-8 text"
        )


@contextmanager
def ticking(bar: tqdm, after: float, every: float) -> Iterator[None]:
    """Redraw ``bar`` every ``every`` seconds once ``after`` seconds have passed, while the
    block runs: its elapsed time then moves during one long forward pass, which updates
    nothing."""
    stop = threading.Event()

    def tick() -> None:
        if stop.wait(after):
            return
        while not stop.is_set():
            bar.refresh()
            stop.wait(every)

    thread = threading.Thread(target=tick, daemon=True)
    if not bar.disable:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()


def load_reader(
    run_dir: Path | str, checkpoint: Path | None = None, device: str = "cpu"
) -> AnswerReader:
    """The reader of a ``relmem train squad`` run (its best weights unless ``checkpoint``),
    or of a folder written by ``relmem export`` (its weights and ``vocab.json``: the
    training file is not needed).

    Raises:
        ValueError: the run is not a reading run, or its data differs from what it trained on.
        CheckpointError: no intact checkpoint.
    """
    from relmem.pretrained import load_pretrained
    from relmem.train.exported import is_exported
    from relmem.train.runs import load_trained

    path = Path(run_dir)
    if is_exported(path) and checkpoint is None:
        model, words, task_name, config = load_pretrained(path, device=device)
        if not isinstance(config.task, ReadingConfig) or not isinstance(words, dict):
            raise ValueError(f"{path} holds a model of {task_name!r}, not a reader")
        return AnswerReader(Vocabulary.from_exported(words), config.task, model)
    _, task_name, task, model, _ = load_trained(
        path, checkpoint, torch.device(device), prefer_best=True
    )
    if not isinstance(task, Reading):
        raise ValueError(f"{path} is a run of {task_name!r}, not a reader (relmem train squad)")
    return AnswerReader(task.vocabulary, task.config, model)


def answer(
    run_dir: Path | str,
    context: str,
    question: str,
    device: str = "cpu",
    *,
    paragraphs: int = PARAGRAPHS,
    top: int = 1,
) -> Answer:
    """One call: the answer a trained reader (a run directory) gives to ``question`` about
    ``context`` (any length: its ``paragraphs`` best ranked paragraphs are read, and the
    answer holds the ``top - 1`` next best as ``alternatives``). Loading the run dominates:
    keep :func:`load_reader`'s reader for many."""
    result = load_reader(run_dir, device=device)(context, question, paragraphs=paragraphs, top=top)
    assert isinstance(result, Answer)
    return result
