"""Whole documents: each question answered from every paragraph of its article, as a person
holding the document rather than the right paragraph would ask it (``relmem eval RUN
--document article``; ``docs/reading.md`` §7).

An article's paragraphs are joined in file order, a blank line apart, and handed with all of
its questions to :class:`~relmem.tasks.reading.answer.AnswerReader`, which reads each
question's ``paragraphs`` best ranked paragraphs (:mod:`~relmem.tasks.reading.ranking`)
and answers with the best span over all of them. Beside the answers, the ranker's recall: the
share of answerable questions whose own paragraph was among those read, which bounds what the
reader's confidence across paragraphs can recover.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn
from tqdm import tqdm

from relmem.tasks.reading.answer import AnswerReader
from relmem.tasks.reading.metric import score_predictions
from relmem.tasks.reading.ranking import ParagraphIndex, split_paragraphs
from relmem.tasks.reading.squad import SquadFile
from relmem.tasks.reading.task import Reading

__all__ = ["ArticleReading", "read_articles", "read_held_out_articles"]

PARAGRAPH_BREAK = "\n\n"  # between an article's paragraphs: split_paragraphs cuts there


@dataclass(frozen=True)
class ArticleReading:
    """What :func:`read_articles` found.

    Attributes:
        predictions: ``{question id: answer text}`` ("" for no answer), the official format.
        recall: the share of answerable questions whose own paragraph was among those read
            (NaN when none is answerable).
        articles: the articles read.
        paragraphs: paragraphs read per question (0: all).
    """

    predictions: dict[str, str]
    recall: float
    articles: int
    paragraphs: int


def read_articles(
    reader: AnswerReader,
    squad: SquadFile,
    questions: Sequence[int],
    paragraphs: int,
    progress: bool = False,
) -> ArticleReading:
    """Answer ``squad``'s questions ``questions`` (indices into ``squad.questions``) from their
    whole articles (the paragraphs of one title), ``paragraphs`` best ranked ones each.

    Raises:
        ValueError: ``paragraphs`` is negative (as :class:`AnswerReader`).
    """
    by_article = squad.questions_by_article(questions)
    members_of = squad.article_paragraphs()
    predictions: dict[str, str] = {}
    found = answerable = 0
    bar = tqdm(total=len(questions), unit="question", delay=2, disable=not progress, leave=False)
    for title, asked in by_article.items():
        members = members_of[title]
        texts = [squad.contexts[p] for p in members]
        widths = (len(t) + len(PARAGRAPH_BREAK) for t in texts[:-1])
        starts = list(itertools.accumulate(widths, initial=0))  # each paragraph's offset
        text = PARAGRAPH_BREAK.join(texts)
        parts = split_paragraphs(text)
        source = [members[bisect.bisect_right(starts, part.start) - 1] for part in parts]
        index = ParagraphIndex([part.text for part in parts], reader.config.ranker)
        answers = reader(text, [squad.questions[i].text for i in asked], paragraphs=paragraphs)
        assert isinstance(answers, list)
        for i, found_answer in zip(asked, answers, strict=True):
            question = squad.questions[i]
            predictions[question.qid] = found_answer.text
            if question.answerable:
                answerable += 1
                read = {source[k] for k in index.top(question.text, paragraphs)}
                found += question.paragraph in read
        bar.update(len(asked))
    bar.close()
    recall = found / answerable if answerable else float("nan")
    return ArticleReading(predictions, recall, len(by_article), paragraphs)


def read_held_out_articles(
    task: Reading, model: nn.Module, paragraphs: int, progress: bool = False
) -> tuple[ArticleReading, dict[str, dict[str, float]]]:
    """``task``'s held-out questions answered by ``model`` from their whole articles
    (:func:`read_articles`), and the official figures of those answers (``{'all':
    score_predictions' output}``)."""
    reader = AnswerReader(task.vocabulary, task.config, model)
    squad = task.held.squad
    asked = task.held_index.tolist()
    reading = read_articles(reader, squad, asked, paragraphs, progress)
    references = {squad.questions[i].qid: list(squad.questions[i].answers) for i in asked}
    return reading, {"all": score_predictions(references, reading.predictions)}
