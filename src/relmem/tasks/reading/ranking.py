"""A long text cut into paragraphs, and its paragraphs ranked against a question
(``relmem answer --paragraphs K`` reads only the K best; ``docs/reading.md`` §6).

Paragraphs are the text's blank-line separated blocks, trimmed of the whitespace around
them; a block longer than ``max_tokens`` tokens is cut into windows of at most that many, at
the end of a sentence where one lies in the window's second half, else between two words.
Each paragraph keeps its character offset and its line in the text, so that an answer found in
it is placed in the whole text. The ranking is BM25+ (``rank_bm25``) over lower-cased words;
``benchmarks/ranking_recall.py`` measured it against TF-IDF, Okapi BM25 and ``bm25s``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from rank_bm25 import BM25Plus

__all__ = [
    "MAX_TOKENS",
    "RANKER_WEIGHT",
    "Paragraph",
    "ParagraphIndex",
    "check_ranker_weight",
    "ranker_bonus",
    "split_paragraphs",
    "words",
]

# beta: how much a paragraph's BM25+ score weighs beside the reader's span scores when the
# answer is chosen among paragraphs (ReadingConfig.ranker_weight). softmax(beta * BM25+) over
# an article's K best paragraphs is the ranker's probability of each holding the answer, beta
# fit by likelihood on the 3,017 questions of the 9 SQuAD training articles the article runs
# train on: 0.68 at K 4, 0.70 at K 8, 0.78 over whole articles (benchmarks/ranker_weight.py;
# docs/reading.md section 7)
RANKER_WEIGHT = 0.7


def ranker_bonus(scores: Sequence[float], weight: float) -> list[float]:
    """What the ranker adds to the score of every span of each paragraph read, given their
    BM25+ ``scores``: ``weight`` times the score less the best's, 0 for the best ranked (the
    log of the ranker's probability ``softmax(weight * BM25+)`` over them, up to a
    constant)."""
    best = max(scores)
    return [weight * (s - best) for s in scores]


def check_ranker_weight(value: float, option: str) -> None:
    """Refuse a ranker weight (``option`` names where it came from) that is negative or not
    finite.

    Raises:
        ValueError: naming the option and the value.
    """
    if not 0 <= value < float("inf"):  # NaN fails too
        raise ValueError(
            f"{option} must be a finite number >= 0 (0: the reader's choice alone), got {value}"
        )


# the longest paragraph read as one, in tokens: longer blocks are cut into windows (the cpu
# preset trains on contexts cut at 400 tokens; SQuAD's paragraphs average 140)
MAX_TOKENS = 400

_BLANK_LINES = re.compile(r"\n\s*\n")
# runs of letters and digits, and every other character alone: at least as many tokens as the
# reader's BERT pre-tokenizer makes of any text (it splits at whitespace and punctuation only)
_TOKENS = re.compile(r"[^\W_]+|\S")
_SENTENCE_END = frozenset(".!?")
_WORDS = re.compile(r"\w+")


@dataclass(frozen=True)
class Paragraph:
    """One paragraph (or window of a long one) of a text.

    Attributes:
        text: the paragraph, ``whole[start:start + len(text)]`` of the text it was cut from.
        start: the character offset of its first character in that text.
        line: the line (from 1) on which it starts.
    """

    text: str
    start: int
    line: int


def split_paragraphs(text: str, max_tokens: int = MAX_TOKENS) -> list[Paragraph]:
    """``text``'s paragraphs in order: its blank-line separated blocks, each trimmed of the
    whitespace around it and cut into windows of at most ``max_tokens`` tokens.

    Returns:
        The paragraphs, none empty; ``[]`` when the text holds only whitespace.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens is {max_tokens}: a paragraph holds at least 1 token")
    paragraphs: list[Paragraph] = []
    block_start, counted, line = 0, 0, 1  # line: the line of character `counted`
    for block_end, next_start in [
        *((m.start(), m.end()) for m in _BLANK_LINES.finditer(text)),
        (len(text), len(text)),
    ]:
        block = text[block_start:block_end]
        stripped = block.strip()
        if stripped:
            start = block_start + len(block) - len(block.lstrip())
            line += text.count("\n", counted, start)
            counted = start
            for offset, window in _windows(stripped, max_tokens):
                line += stripped.count("\n", counted - start, offset)
                counted = start + offset
                paragraphs.append(Paragraph(window, start + offset, line))
        block_start = next_start
    return paragraphs


def _windows(text: str, max_tokens: int) -> list[tuple[int, str]]:
    """``text`` (no whitespace at either end) cut into ``(offset, window)`` pieces of at most
    ``max_tokens`` tokens, each trimmed."""
    if len(text) <= max_tokens:  # a token is at least one character
        return [(0, text)]
    bounds = [(m.start(), m.end()) for m in _TOKENS.finditer(text)]  # [N] tokens' offsets
    pieces, first = [], 0
    while first < len(bounds):
        last = min(first + max_tokens, len(bounds)) - 1  # the window's last token, at most
        if last < len(bounds) - 1:
            last = _cut(text, bounds, first, last)
        begin, end = bounds[first][0], bounds[last][1]
        pieces.append((begin, text[begin:end]))
        first = last + 1
    return pieces


def _cut(text: str, bounds: list[tuple[int, int]], first: int, last: int) -> int:
    """The last token of the window that starts at token ``first`` and may run to ``last``:
    a sentence's end (``.``, ``!`` or ``?`` before whitespace) in the window's second half,
    else the last token before whitespace there, else ``last``."""
    half = first + (last - first + 1) // 2
    word_end = None
    for i in range(last, half - 1, -1):
        if bounds[i][1] < bounds[i + 1][0]:  # whitespace follows token i
            if text[bounds[i][0] : bounds[i][1]] in _SENTENCE_END:
                return i
            word_end = i if word_end is None else word_end
    return last if word_end is None else word_end


def words(text: str) -> list[str]:
    """The lower-cased words (runs of letters, digits and ``_``) of ``text`` that rank it."""
    return _WORDS.findall(text.lower())


class ParagraphIndex:
    """Paragraphs ready to be ranked against questions: BM25+ (Lv and Zhai 2011; k1 1.5,
    b 0.75, delta 1) over :func:`words`, each paragraph a document and the term statistics
    the paragraphs' own.

    Args:
        paragraphs: the paragraphs' texts ``[P]`` (not all empty of words).
    """

    def __init__(self, paragraphs: list[str]) -> None:
        self.texts = list(paragraphs)
        self._bm25 = BM25Plus([words(p) or [""] for p in self.texts], k1=1.5, b=0.75)

    def scores(self, question: str) -> np.ndarray:
        """``[P]`` float64: each paragraph's BM25 score for ``question`` (higher: better)."""
        return np.asarray(self._bm25.get_scores(words(question)), dtype=np.float64)

    def top(self, question: str, k: int) -> list[int]:
        """The indices of the ``k`` best paragraphs for ``question``, best first (all when
        ``k`` is 0 or more than there are), a paragraph whose text repeats an earlier one's
        left out; ties in file order."""
        return self.ranked(question, k)[0]

    def ranked(self, question: str, k: int) -> tuple[list[int], list[float]]:
        """:meth:`top`'s paragraphs and, in the same order, their scores."""
        scores = self.scores(question)
        order = np.argsort(-scores, kind="stable").tolist()
        seen: set[str] = set()
        picked = []
        for i in order:
            if self.texts[i] not in seen:
                seen.add(self.texts[i])
                picked.append(i)
        picked = picked[:k] if k > 0 else picked
        return picked, [float(scores[i]) for i in picked]
