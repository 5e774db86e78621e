"""Reading files in SQuAD's JSON layout (v1.1, v2.0, and conversions such as TriviaQA's).

A file is checked whole before anything is built from it: every error names the file and the
record (``data[3].paragraphs[0].qas[7]``) and says what to fix. Beyond the layout, every text
must be valid Unicode (no lone surrogate from a ``\\ud800`` escape), every question non-empty,
and every answer's text must stand in its context at its ``answer_start`` (whitespace may
differ). An article without a title (missing or null) counts as an article of its own.

Contexts and questions are split into tokens that keep their character offsets
(:func:`tokenize`), so a span of tokens maps back to the exact text of the context, its case
and spacing included; each reference answer is mapped from its ``answer_start`` to a token
span (:func:`align`).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relmem.files import FileRefused, read_json

__all__ = [
    "Question",
    "SquadError",
    "SquadFile",
    "align",
    "lone_surrogate",
    "read_squad",
    "tokenize",
]


class SquadError(ValueError):
    """A file that is not valid SQuAD-layout JSON; the message names the file and the record."""


@dataclass(frozen=True)
class Question:
    """One question of a file.

    Attributes:
        qid: its id, unique in the file.
        text: the question.
        paragraph: index of its context in :attr:`SquadFile.contexts`.
        answers: the reference answers' texts (empty: unanswerable, v2.0).
        answer_starts: each reference's character offset in the context.
    """

    qid: str
    text: str
    paragraph: int
    answers: tuple[str, ...]
    answer_starts: tuple[int, ...]

    @property
    def answerable(self) -> bool:
        """Whether the question has a reference answer."""
        return bool(self.answers)


@dataclass(frozen=True)
class SquadFile:
    """A file's paragraphs and questions, in file order.

    Attributes:
        path: where it was read from.
        contexts: every paragraph's text.
        titles: the article title of each paragraph (``article N`` for the untitled article
            ``data[N]``).
        questions: every question, each pointing at its paragraph.
    """

    path: Path
    contexts: list[str]
    titles: list[str]
    questions: list[Question]

    @property
    def has_unanswerable(self) -> bool:
        """Whether some question has no answer (a v2.0 file)."""
        return any(not q.answerable for q in self.questions)

    def articles(self) -> list[str]:
        """The distinct article titles, in file order."""
        return list(dict.fromkeys(self.titles))

    def article_paragraphs(self) -> dict[str, list[int]]:
        """Each article's paragraphs (indices into :attr:`contexts`, in file order), by title,
        the articles in file order."""
        members: dict[str, list[int]] = {}
        for p, title in enumerate(self.titles):
            members.setdefault(title, []).append(p)
        return members

    def questions_by_article(self, questions: Iterable[int]) -> dict[str, list[int]]:
        """``questions`` (indices into :attr:`questions`, in their order) grouped by their
        article's title, the articles in the order their first question comes."""
        asked: dict[str, list[int]] = {}
        for i in questions:
            asked.setdefault(self.titles[self.questions[i].paragraph], []).append(i)
        return asked


def _fail(path: Path, where: str, message: str) -> SquadError:
    return SquadError(f"{path}: {where}: {message}")


def lone_surrogate(text: str) -> int | None:
    """The offset of the first lone surrogate in ``text`` (None: it is valid Unicode).

    JSON's ``\\ud800`` escapes and command-line bytes that are not UTF-8 (which Python turns
    into ``\\udc80``-``\\udcff``) give strings that no UTF-8 file or tokenizer accepts."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def _check_unicode(path: Path, where: str, text: str) -> None:
    at = lone_surrogate(text)
    if at is not None:
        raise _fail(
            path,
            where,
            f"holds a lone surrogate ({ascii(text[at])}) at character {at}, which is not "
            "Unicode text: fix the escape (a \\ud800-\\udfff escape must be one half of a pair)",
        )


def _field(path: Path, where: str, record: Any, key: str, kind: type) -> Any:
    if not isinstance(record, dict):
        raise _fail(path, where, f"expected a JSON object, got {type(record).__name__}")
    if key not in record:
        raise _fail(path, where, f"has no {key!r}")
    value = record[key]
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise _fail(path, f"{where}.{key}", f"expected {kind.__name__}, got {value!r:.60}")
    if isinstance(value, str):
        _check_unicode(path, f"{where}.{key}", value)
    return value


def _title(path: Path, a: int, article: Any) -> str:
    """Article ``data[a]``'s title; ``article a`` when it has none (missing or null), so that
    each untitled article is an article of its own in a split by article."""
    title = article.get("title") if isinstance(article, dict) else None
    if title is None:
        return f"article {a}"
    title = str(title)
    _check_unicode(path, f"data[{a}].title", title)
    return title


def read_squad(path: Path) -> SquadFile:
    """Read and check a file in SQuAD's layout.

    Raises:
        SquadError: the file is missing, not a regular file, not UTF-8, not JSON (or nested
            too deep), or a record breaks the layout: no ``data`` list, an empty context or
            question, a question without an id, a duplicate id, a lone surrogate in a text, an
            answer whose ``answer_start`` lies outside its context or whose text is not the
            context's there.
    """
    path = Path(path)
    try:
        document = read_json(path)
    except FileRefused as exc:
        raise SquadError(f"{exc}; a SQuAD-layout file is UTF-8 JSON") from None
    articles = _field(path, "the top level", document, "data", list)
    contexts: list[str] = []
    titles: list[str] = []
    questions: list[Question] = []
    seen: dict[str, str] = {}
    misplaced: list[str] = []
    for a, article in enumerate(articles):
        where = f"data[{a}]"
        title = _title(path, a, article)
        for p, paragraph in enumerate(_field(path, where, article, "paragraphs", list)):
            at = f"{where}.paragraphs[{p}]"
            context = _field(path, at, paragraph, "context", str)
            if not context.strip():
                raise _fail(path, f"{at}.context", "is empty")
            index = len(contexts)
            contexts.append(context)
            titles.append(title)
            for k, qa in enumerate(_field(path, at, paragraph, "qas", list)):
                question = _question(path, f"{at}.qas[{k}]", qa, context, index, seen, misplaced)
                questions.append(question)
    if misplaced:
        answers = sum(len(q.answers) for q in questions)
        others = f" (and {len(misplaced) - 1:,} more of the file's {answers:,} answers)"
        raise _fail(
            path,
            misplaced[0] + (others if len(misplaced) > 1 else ""),
            "answer_start must be the character offset of the answer's text in the context "
            "(0 its first character, whitespace counted); fix the offsets or the texts",
        )
    if not questions:
        raise SquadError(f"{path}: holds no questions")
    return SquadFile(path, contexts, titles, questions)


def _matches(context: str, start: int, text: str) -> bool:
    """Whether ``text`` stands in ``context`` at ``start`` (whitespace may differ: a tab or a
    no-break space in one, a space in the other)."""
    found = context[start : start + len(text)]
    return found == text or found.split() == text.split()


def _question(
    path: Path,
    where: str,
    qa: Any,
    context: str,
    paragraph: int,
    seen: dict[str, str],
    misplaced: list[str],
) -> Question:
    """The question ``qa``; an answer whose text is not in the context at its
    ``answer_start`` is described in ``misplaced`` (the file is refused once read whole)."""
    qid = _field(path, where, qa, "id", str)
    if not qid:
        raise _fail(path, f"{where}.id", "is empty")
    if qid in seen:
        raise _fail(path, f"{where}.id", f"{qid!r} repeats the id of {seen[qid]}")
    seen[qid] = where
    text = _field(path, where, qa, "question", str)
    if not text.strip():
        raise _fail(path, f"{where}.question", "is empty: write the question, or remove the record")
    impossible = qa.get("is_impossible", False)
    if not isinstance(impossible, bool):
        raise _fail(path, f"{where}.is_impossible", f"expected true or false, got {impossible!r}")
    answers = [] if impossible else _field(path, where, qa, "answers", list)
    texts, starts = [], []
    for j, answer in enumerate(answers):
        at = f"{where}.answers[{j}]"
        answer_text = _field(path, at, answer, "text", str)
        start = _field(path, at, answer, "answer_start", int)
        if not 0 <= start < len(context) or start + len(answer_text) > len(context):
            raise _fail(
                path,
                f"{at}.answer_start",
                f"{start} (answer of {len(answer_text)} characters) lies outside its context "
                f"of {len(context)} characters",
            )
        if not _matches(context, start, answer_text):
            found = context[start : start + len(answer_text)]
            elsewhere = context.find(answer_text)
            hint = f", it stands at {elsewhere}" if elsewhere >= 0 else ""
            misplaced.append(
                f"{at}: the text {answer_text!r:.50} is not the context's at answer_start "
                f"{start} ({found!r:.50}{hint})"
            )
        texts.append(answer_text)
        starts.append(start)
    if not impossible and not texts:
        raise _fail(path, f"{where}.answers", "is empty, and is_impossible is not true")
    return Question(qid, text, paragraph, tuple(texts), tuple(starts))


_PRE_TOKENIZER: Any = None


def tokenize(text: str) -> list[tuple[int, int]]:
    """The tokens of ``text`` as ``(start, end)`` character offsets (``text[start:end]``).

    Hugging Face ``tokenizers``' BERT pre-tokenizer: split at whitespace and around every
    punctuation character, offsets into the original string (``docs/reading.md`` §2).
    """
    global _PRE_TOKENIZER
    if _PRE_TOKENIZER is None:
        from tokenizers.pre_tokenizers import BertPreTokenizer

        _PRE_TOKENIZER = BertPreTokenizer()
    return [span for _, span in _PRE_TOKENIZER.pre_tokenize_str(text)]


def align(spans: list[tuple[int, int]], start: int, end: int) -> tuple[int, int] | None:
    """The token span ``(first, last)`` (inclusive) covering characters ``start..end-1``, or
    None when no token overlaps them (an answer of only whitespace). ``spans`` are ordered
    ``(start, end)`` character offsets."""
    first = bisect.bisect_right([e for _, e in spans], start)  # the first token ending after
    last = bisect.bisect_left([s for s, _ in spans], end) - 1  # the last token starting before
    if first > last:
        return None
    return first, last
