"""Questions read from their whole articles in training and evaluation
(``relmem train squad --task.document article``; ``docs/reading.md`` §7).

An article is the paragraphs of one title, in file order. Each question's article is ranked
against it by the ranker (:class:`~relmem.tasks.reading.ranking.ParagraphIndex`, one index
per article), and its row reads ``top_k`` of those paragraphs joined in article order as one
context: a training row its own paragraph and the best ranked others (distractors), a
held-out row the best ranked, its own among them or not, as a reader given the article and not
the paragraph would read it. The reader's one softmax over a row's whole context then
normalises the start and end scores across the paragraphs read (``allenai/document-qa``'s
shared normalisation).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from relmem.tasks.reading.ranking import DEFAULT_RANKER, ParagraphIndex, Ranker, ranker_bonus
from relmem.tasks.reading.squad import SquadFile

__all__ = [
    "Ranking",
    "bonus_by_token",
    "check_articles",
    "held_out_paragraphs",
    "rank_in_articles",
    "ranks_in_row",
    "training_paragraphs",
]


def check_articles(squad: SquadFile, top_k: int) -> None:
    """Refuse reading ``squad``'s questions from their articles when there is nothing to rank,
    or ``top_k`` paragraphs more than its largest article holds.

    Raises:
        ValueError: every article has one paragraph, or ``top_k`` exceeds the paragraphs of
            the largest article (naming the file, the option and that count).
    """
    largest = max(len(members) for members in squad.article_paragraphs().values())
    if largest == 1:
        raise ValueError(
            f"--task.document article: nothing to rank: every article of {squad.path} has one "
            "paragraph (paragraphs are grouped by their article's title; an untitled article "
            "is one of its own): give the articles titles, or train with --task.document "
            "paragraph"
        )
    if top_k > largest:
        raise ValueError(
            f"task.top_k must be <= {largest}, the paragraphs of the largest article of "
            f"{squad.path}, got {top_k} (0 reads every paragraph of an article)"
        )


class Ranking(NamedTuple):
    """One question's article ranked against it.

    Attributes:
        paragraphs: the article's paragraphs (indices into ``SquadFile.contexts``), best first.
        scores: their ranker scores for the question, in the same order (non-increasing).
    """

    paragraphs: list[int]
    scores: list[float]


def rank_in_articles(
    squad: SquadFile, questions: Iterable[int], ranker: Ranker = DEFAULT_RANKER
) -> dict[int, Ranking]:
    """Each question's article ranked against it by ``ranker``, one index built per article:
    ``{question: Ranking}``. A paragraph whose text repeats an earlier one's is left out, and
    a question's own paragraph stands in the place of its twin (so that its gold span is read
    where the text is)."""
    members = squad.article_paragraphs()
    ranked: dict[int, Ranking] = {}
    for title, mine in squad.questions_by_article(questions).items():
        paragraphs = members[title]
        index = ParagraphIndex([squad.contexts[p] for p in paragraphs], ranker)
        for i in mine:
            own = squad.questions[i].paragraph
            order, scores = index.ranked(squad.questions[i].text, 0)
            read = (paragraphs[k] for k in order)
            ranked[i] = Ranking(
                [own if squad.contexts[p] == squad.contexts[own] else p for p in read], scores
            )
    return ranked


def training_paragraphs(
    ranked: Sequence[int],
    own: int,
    top_k: int,
    sizes: Sequence[int],
    max_tokens: int | None,
    gap: int = 0,
) -> list[int]:
    """A training row's paragraphs, in article order: the question's own paragraph ``own``
    and the best ranked others of ``ranked`` as distractors, up to ``top_k`` paragraphs in all
    (0: every one), passing over a distractor that would take the row past ``max_tokens``
    steps (``sizes``: each paragraph's tokens, ``gap`` steps between two paragraphs; None: no
    bound). Whole distractors are left out rather than the row cut, so that the gold span
    stays in every row that a paragraph-level row keeps it in, and no row ends
    mid-paragraph."""
    room = float("inf") if max_tokens is None else max_tokens - sizes[own]
    picked = [own]
    for p in ranked:
        if top_k and len(picked) == top_k:
            break
        if p != own and sizes[p] + gap <= room:
            picked.append(p)
            room -= sizes[p] + gap
    return sorted(picked)


def held_out_paragraphs(ranked: Sequence[int], top_k: int) -> list[int]:
    """A held-out row's paragraphs, in article order: the ``top_k`` best of ``ranked`` (0:
    every one), the question's own paragraph among them only where the ranking put it
    there."""
    return sorted(ranked[:top_k] if top_k else ranked)


def ranks_in_row(ranked: Sequence[int], paragraphs: Sequence[int]) -> list[int]:
    """Each of a row's ``paragraphs``' rank among them (from 1, the best), in the order of
    ``ranked`` (its article's paragraphs, best first, which holds every one of them)."""
    place = {p: k for k, p in enumerate(ranked)}
    order = sorted(paragraphs, key=place.__getitem__)
    return [order.index(p) + 1 for p in paragraphs]


def bonus_by_token(segments: Tensor, scores: Sequence[Sequence[float]], weight: float) -> Tensor:
    """What the ranker adds to the score of a span starting at each context token: its
    paragraph's :func:`~relmem.tasks.reading.ranking.ranker_bonus` among its row's.

    Args:
        segments: ``[B, T]`` int64, each context token's paragraph in its row (-1 for padding
            and gaps).
        scores: per row, its paragraphs' ranker scores in row order.
        weight: beta (0: nothing added).

    Returns:
        ``[B, T]`` float32, 0 on padding and gaps and in a one-paragraph row.
    """
    bonus = torch.zeros(segments.shape, dtype=torch.float32, device=segments.device)
    for row, mine in enumerate(scores):
        if weight == 0 or len(mine) < 2:
            continue
        values = torch.tensor(ranker_bonus(mine, weight), device=segments.device)  # [P]
        inside = segments[row] >= 0
        bonus[row, inside] = values[segments[row, inside]].float()
    return bonus
