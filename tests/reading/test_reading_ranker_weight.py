"""The ranker's word in the choice among paragraphs (``--task.ranker-weight``): a span's score
gains beta times its paragraph's ranker score less the best read paragraph's, in article rows
and in ``relmem answer``'s paragraphs; training takes it too with ``--task.ranker-in-loss``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from reading_sample import Spotter
from test_reading_article_training import articles_file, build  # noqa: F401

from relmem import cli
from relmem.tasks.reading.answer import AnswerReader
from relmem.tasks.reading.articles import bonus_by_token
from relmem.tasks.reading.data import Vocabulary
from relmem.tasks.reading.ranking import (
    RANKER_WEIGHT,
    RANKERS,
    ParagraphIndex,
    Ranker,
    split_paragraphs,
)
from relmem.tasks.reading.task import HELD_OUT, ReadingConfig, best_spans


def test_the_bonus_is_beta_times_the_score_below_the_rows_best() -> None:
    segments = torch.tensor([[0, 0, -1, 1, 1, 2, -1], [0, 0, 0, -1, -1, -1, -1]])
    scores = [[2.0, 5.0, 4.0], [3.0]]
    bonus = bonus_by_token(segments, scores, 0.5)
    assert bonus.tolist() == [[-1.5, -1.5, 0.0, 0.0, 0.0, -0.5, 0.0], [0.0] * 7]
    assert not bonus_by_token(segments, scores, 0.0).any()


TEXT = "Karl kept bees.\n\nFrisch decoded the waggle dance of honey bees."
QUESTION = "Who decoded the waggle dance?"


@pytest.mark.parametrize("ranker", RANKERS)
@pytest.mark.parametrize("weight", [0.0, RANKER_WEIGHT, 1.0])
def test_answer_weighs_the_ranker_beside_the_reader(ranker: Ranker, weight: float) -> None:
    config = ReadingConfig(ranker=ranker, ranker_weight=weight)
    # a reader that scores "karl" (id 2) 5 and "frisch" (id 3) 4 as start and end, every
    # other token -3, and "no answer" never
    spotter = Spotter({2: 5.0, 3: 4.0}, other=-3.0, null=float("-inf"))
    reader = AnswerReader(Vocabulary(("karl", "frisch"), ("a",)), config, spotter)
    scores = ParagraphIndex([p.text for p in split_paragraphs(TEXT)], ranker).scores(QUESTION)
    assert scores[1] > scores[0]  # the ranker puts Frisch's paragraph first
    karl, frisch = 10.0 + weight * (scores[0] - scores[1]), 8.0  # start + end, with the bonus
    result = reader(TEXT, QUESTION, paragraphs=0, top=2)
    assert not isinstance(result, list)
    best, second = (("Karl", karl), ("Frisch", frisch))[:: 1 if karl > frisch else -1]
    assert (result.text, result.score) == pytest.approx(best)
    assert (result.alternatives[0].text, result.alternatives[0].score) == pytest.approx(second)
    assert weight != 0 or result.text == "Karl"
    assert weight != 1.0 or result.text == "Frisch"
    # the probability stays the reader's own: one softmax over both paragraphs' 13 tokens
    norm = math.exp(5) + math.exp(4) + 11 * math.exp(-3)
    found = {a.text: a.probability for a in (result, *result.alternatives)}
    assert found["Karl"] == pytest.approx((math.exp(5) / norm) ** 2)


@pytest.mark.parametrize("weight", [0.0, 0.3, 2.0])
def test_article_rows_choose_with_the_ranker_weight(articles_file: Path, weight: float) -> None:  # noqa: F811
    task = build(articles_file, top_k=3, ranker_weight=weight)
    batch = task.held_out(torch.device("cpu"))
    rows = [
        r for r in range(batch.size) if len(task.contexts[HELD_OUT][int(batch.targets[r, 2])]) > 1
    ]
    assert rows
    steps = int(batch.lengths.max()) - task.config.question_tokens
    segments = task._segments(batch, steps)
    # the reader's scores: every start and end -2, but for a one-token span at the first token
    # of each paragraph, scored 3 + half the paragraph's place in the row (the last best)
    logits = torch.full((batch.size, 1 + steps, 2), -2.0)
    logits[:, 0] = float("-inf")
    logits[:, 1:][segments < 0] = float("-inf")
    firsts = {}
    for row in rows:
        for s in range(int(segments[row].max()) + 1):
            t = int((segments[row] == s).nonzero()[0])
            logits[row, 1 + t] = 3.0 + s / 2
            firsts[row, s] = t
    texts = task.predicted_texts(logits, batch)
    squad = task.held.squad
    for row in rows:
        i = int(batch.targets[row, 2])
        read = task.contexts[HELD_OUT][i]
        members = squad.article_paragraphs()[squad.titles[read[0]]]
        index = ParagraphIndex([squad.contexts[p] for p in members])
        bm25 = index.scores(squad.questions[i].text)
        score = [float(bm25[members.index(p)]) for p in read]
        # each paragraph's first token as a span: 2 (3 + s / 2) plus beta's bonus on its start
        totals = [2 * (3.0 + s / 2) + weight * (score[s] - max(score)) for s in range(len(read))]
        chosen = max(range(len(read)), key=lambda s: (totals[s], -s))
        first = firsts[row, chosen]
        expected = task.held.answer_text(i, first, first, read, task.gap)[0]
        assert texts[row] == expected, (row, totals)
    # weight 0 is the reader's choice alone: best_spans on the logits as they are
    if weight == 0:
        first, _, _ = best_spans(logits, task.config.max_answer_tokens, segments)
        for row in rows:
            assert int(segments[row, first[row]]) == int(segments[row].max())


@pytest.mark.parametrize("weight", [-0.5, float("nan"), float("inf")])
def test_a_bad_ranker_weight_is_refused(weight: float) -> None:
    with pytest.raises(ValueError, match=r"task.ranker_weight must be a finite number >= 0"):
        ReadingConfig(ranker_weight=weight)


def test_a_negative_ranker_weight_exits_2(tmp_path: Path, capsys) -> None:
    data = str(tmp_path / "none.json")
    args = ["train", "squad", "--task.train-file", data, "--task.ranker-weight", "-1",
            "--out-dir", str(tmp_path), "--run-name", "r"]  # fmt: skip
    assert cli.main(args) == 2
    assert "task.ranker_weight must be a finite number >= 0" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("in_loss", [False, True])
def test_the_loss_takes_the_rankers_word_when_asked(articles_file: Path, in_loss: bool) -> None:  # noqa: F811
    """``ranker_in_loss``: the cross-entropy is taken on the start scores plus each paragraph's
    bonus (by hand below), and its gradient reaches the reader's scores; without it, on the
    reader's scores alone. The chosen answers are the same either way."""
    task = build(articles_file, top_k=3, ranker_weight=0.9, ranker_in_loss=in_loss)
    batch = task.sample(6, torch.Generator().manual_seed(0))
    steps = int(batch.lengths.max()) - task.config.question_tokens
    segments = task._segments(batch, steps)
    torch.manual_seed(1)
    logits = torch.randn(batch.size, 1 + steps, 2, dtype=torch.float64)
    logits[:, 0] = float("-inf")
    logits[:, 1:][segments < 0] = float("-inf")
    logits.requires_grad_(True)
    measures = task.measure(logits, batch)
    expected = logits.detach().float().clone()
    if in_loss:
        for row in range(batch.size):
            read = task.contexts[int(batch.targets[row, 3])][int(batch.targets[row, 2])]
            scores = task.ranker_scores[int(batch.targets[row, 3])][int(batch.targets[row, 2])]
            assert len(scores) == len(read)
            for t in range(steps):
                s = int(segments[row, t])
                if s >= 0:
                    expected[row, 1 + t, 0] += 0.9 * (scores[s] - max(scores))
    gold = batch.targets[:, :2]
    target = torch.where(gold >= 0, gold + 1, torch.zeros_like(gold))
    xent = torch.nn.functional.cross_entropy(expected, target, reduction="none").sum(dim=1)
    assert (gold[:, 0] >= 0).all()
    torch.testing.assert_close(measures["loss"].value(), xent.mean().float())
    measures["loss"].value().backward()
    assert logits.grad is not None and logits.grad[:, 1:].abs().sum() > 0
    plain = build(articles_file, top_k=3, ranker_weight=0.9)
    assert task.predicted_texts(logits, batch) == plain.predicted_texts(logits, batch)


def test_the_ranker_in_the_loss_needs_articles() -> None:
    with pytest.raises(ValueError, match="task.ranker_in_loss .* needs --task.document article"):
        ReadingConfig(ranker_in_loss=True)
