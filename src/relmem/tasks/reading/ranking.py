"""A long text cut into paragraphs, and its paragraphs ranked against a question
(``relmem answer --paragraphs K`` reads only the K best; ``docs/reading.md`` §6).

Paragraphs are the text's blank-line separated blocks, trimmed of the whitespace around
them; a block longer than ``max_tokens`` tokens is cut into windows of at most that many, at
the end of a sentence where one lies in the window's second half, else between two words.
Each paragraph keeps its character offset and its line in the text, so that an answer found in
it is placed in the whole text. Two rankers (``docs/reading.md`` §6):

- ``bm25``: BM25+ (``rank_bm25``) over the question's lower-cased words;
  ``benchmarks/ranking_recall.py`` measured it against TF-IDF, Okapi BM25 and ``bm25s``.
- ``bm25-proximity`` (the default): BM25+ over the question's content words (``STOP_WORDS``
  left out), BM25+ over its pairs of adjacent words, and how much of the question's words
  stand close together in the paragraph (:func:`proximity`), weighed as
  ``benchmarks/ranker_fit.py`` fit them on SQuAD training articles.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from rank_bm25 import BM25Plus

__all__ = [
    "DEFAULT_RANKER",
    "MAX_TOKENS",
    "RANKERS",
    "RANKER_WEIGHT",
    "STOP_WORDS",
    "Paragraph",
    "ParagraphIndex",
    "Ranker",
    "check_ranker_weight",
    "proximity",
    "ranker_bonus",
    "split_paragraphs",
    "stem",
    "word_pairs",
    "words",
]

Ranker = Literal["bm25", "bm25-proximity"]
RANKERS: tuple[Ranker, ...] = ("bm25", "bm25-proximity")
DEFAULT_RANKER: Ranker = "bm25-proximity"

# beta: how much a paragraph's ranker score weighs beside the reader's span scores when the
# answer is chosen among paragraphs (ReadingConfig.ranker_weight). softmax(beta * score) over
# an article's K best paragraphs is the ranker's probability of each holding the answer. For
# `bm25`, beta was fit by likelihood on the 3,017 questions of the 9 SQuAD training articles
# the article runs train on: 0.68 at K 4, 0.70 at K 8, 0.78 over whole articles
# (benchmarks/ranker_weight.py; docs/reading.md section 7). `bm25-proximity`'s weights below
# were fit with beta held at this value, so that it is that ranker's calibration too.
RANKER_WEIGHT = 0.7

# question words that say what is asked rather than where the answer stands: bm25-proximity
# leaves them out of its word scores and its proximity (not out of its word pairs)
_STOP_WORDS = """a an and are as at be been being by can could did do does done for from had
has have he her his how in into is it its not no of on or she should than that the their then
there these they this those to was were what when where which who whom whose why will with
would"""
STOP_WORDS = frozenset(_STOP_WORDS.split())
# bm25-proximity: score = WORDS * BM25+(content words) + PAIRS * BM25+(word pairs) +
# PROXIMITY * proximity (a share, 0 to 1), fit by likelihood over whole articles on the 3,017
# questions of the 9 SQuAD training articles, beta held at RANKER_WEIGHT
# (`python benchmarks/ranker_fit.py --file train-v1.1-first-articles.json --held-out-articles
# 0.2 --split-seed 0`; docs/reading.md section 6)
WORDS_WEIGHT = 0.6576
PAIRS_WEIGHT = 0.3203
PROXIMITY_WEIGHT = 8.618
# proximity's window: question words fewer than this many words apart (inside one window of
# this many words) count as close
PROXIMITY_WINDOW = 20


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


def word_pairs(text_words: Sequence[str]) -> list[str]:
    """The pairs of adjacent words of ``text_words``, each as one term (``"new york"``)."""
    return [f"{a} {b}" for a, b in zip(text_words, text_words[1:], strict=False)]


def stem(word: str) -> str:
    """``word`` with one plural or verb ending (``-ing``, ``-ed``, ``-es``, ``-s``) cut, when
    at least four letters stay: a light stemmer, so that "rivers" and "river" meet."""
    for ending in ("ing", "ed", "es", "s"):
        if len(word) > len(ending) + 3 and word.endswith(ending):
            return word[: -len(ending)]
    return word


def proximity(
    paragraph: Sequence[str], question: set[str], idf: dict[str, float], total: float
) -> float:
    """How much of the question stands together in ``paragraph``: the largest idf mass of
    distinct ``question`` terms that occur within ``PROXIMITY_WINDOW`` words of each other,
    as a share of the question's whole mass ``total``.

    Args:
        paragraph: the paragraph's terms, in order.
        question: the question's terms.
        idf: each term's weight.
        total: the question's mass (> 0), its terms absent from ``idf`` included.

    Returns:
        A share in [0, 1] (0 when no question term occurs).
    """
    hits = [(k, term) for k, term in enumerate(paragraph) if term in question]
    counts: Counter[str] = Counter()
    best = mass = 0.0
    first = 0
    for position, term in hits:  # the window ending at each hit: two pointers
        if counts[term] == 0:
            mass += idf[term]
        counts[term] += 1
        while position - hits[first][0] >= PROXIMITY_WINDOW:
            left = hits[first][1]
            counts[left] -= 1
            if counts[left] == 0:
                mass -= idf[left]
            first += 1
        best = max(best, mass)
    return best / total


class ParagraphIndex:
    """Paragraphs ready to be ranked against questions, each paragraph a document and the
    term statistics the paragraphs' own.

    - ``bm25``: BM25+ (Lv and Zhai 2011; k1 1.5, b 0.75, delta 1) over :func:`words`.
    - ``bm25-proximity``: :meth:`features` weighed by ``WORDS_WEIGHT``, ``PAIRS_WEIGHT`` and
      ``PROXIMITY_WEIGHT``.

    Args:
        paragraphs: the paragraphs' texts ``[P]`` (not all empty of words).
        ranker: ``bm25`` or ``bm25-proximity``.
    """

    def __init__(self, paragraphs: list[str], ranker: Ranker = DEFAULT_RANKER) -> None:
        if ranker not in RANKERS:
            raise ValueError(f"ranker must be one of {', '.join(RANKERS)}, got {ranker!r}")
        self.texts = list(paragraphs)
        self.ranker = ranker
        terms = [words(p) for p in self.texts]
        self._bm25 = BM25Plus([t or [""] for t in terms], k1=1.5, b=0.75)
        if ranker == "bm25-proximity":
            self._pairs = BM25Plus([word_pairs(t) or [""] for t in terms], k1=1.5, b=0.75)
            self._stems = [[stem(w) for w in t] for t in terms]
            counts = Counter(s for t in self._stems for s in set(t))
            n = len(self.texts)
            self._idf = {s: math.log((n + 1) / c) for s, c in counts.items()}  # BM25+'s idf
            self._absent_idf = math.log(n + 1)  # a term as rare as one paragraph's

    def features(self, question: str) -> np.ndarray:
        """``[P, 3]`` float64, ``bm25-proximity``'s three scores of each paragraph for
        ``question``: BM25+ over its content words (every word when all are stop words),
        BM25+ over its word pairs, and :func:`proximity` of its content words' stems."""
        if self.ranker != "bm25-proximity":
            raise ValueError(f"features: the {self.ranker} ranker has none; use scores()")
        asked = words(question)
        content = [w for w in asked if w not in STOP_WORDS] or asked
        stems = {stem(w) for w in content}
        total = sum(self._idf.get(s, self._absent_idf) for s in stems)
        present = {s for s in stems if s in self._idf}
        near = [proximity(t, present, self._idf, total) if total else 0.0 for t in self._stems]
        return np.stack(
            [
                np.asarray(self._bm25.get_scores(content), dtype=np.float64),
                np.asarray(self._pairs.get_scores(word_pairs(asked)), dtype=np.float64),
                np.asarray(near, dtype=np.float64),
            ],
            axis=1,
        )

    def scores(self, question: str) -> np.ndarray:
        """``[P]`` float64: each paragraph's score for ``question`` (higher: better)."""
        if self.ranker == "bm25":
            return np.asarray(self._bm25.get_scores(words(question)), dtype=np.float64)
        weights = np.array([WORDS_WEIGHT, PAIRS_WEIGHT, PROXIMITY_WEIGHT])
        return self.features(question) @ weights

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
