"""Fit the ``bm25-proximity`` ranker's three weights, and measure both rankers' recall.

Each answerable question of a SQuAD-layout file is ranked among its own article's paragraphs
(one copy of a repeated paragraph). The ranker's probability that paragraph p holds the answer
is ``softmax(beta * score)``, ``score = w · features`` (``ParagraphIndex.features``: BM25+
over the question's content words, BM25+ over its word pairs, the proximity of its words);
``beta * w`` maximises the log-likelihood of the gold paragraphs (L-BFGS; the objective is
concave), and ``w`` is reported with beta held at ``RANKER_WEIGHT``: the constants
``WORDS_WEIGHT``, ``PAIRS_WEIGHT`` and ``PROXIMITY_WEIGHT`` of ``relmem.tasks.reading.ranking``.
With ``--held-out-articles`` the held-out articles (drawn as ``relmem train squad`` draws
them) are left out of the fit and scored apart. Prints, per question set, the top-k recall of
``bm25``, of ``bm25-proximity`` at the fitted weights and at the library's, and their mean
log-likelihood; ``--json`` writes them with the machine.

    python benchmarks/ranker_fit.py --file train-v1.1-first-articles.json \\
        --held-out-articles 0.2 --split-seed 0
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from ranker_weight import add_split_arguments, read_split  # benchmarks/, beside this

from relmem.tasks.reading import ranking
from relmem.tasks.reading.ranking import RANKER_WEIGHT, ParagraphIndex
from relmem.tasks.reading.squad import SquadFile

KS = (1, 2, 4, 8)


class Question(NamedTuple):
    """One question's candidates: ``bm25 [P]``, ``features [P, 3]``, the gold's index."""

    bm25: np.ndarray
    features: np.ndarray
    gold: int


def questions(squad: SquadFile, held: set[str]) -> tuple[list[Question], list[Question]]:
    """``(fit, unseen)``: every answerable question of ``squad`` with its article's
    candidates, split by its article's title."""
    members = squad.article_paragraphs()
    answerable = [i for i, q in enumerate(squad.questions) if q.answerable]
    fit, unseen = [], []
    for title, asked in squad.questions_by_article(answerable).items():
        texts = list(dict.fromkeys(squad.contexts[p] for p in members[title]))
        plain = ParagraphIndex(texts, "bm25")
        mixed = ParagraphIndex(texts, "bm25-proximity")
        for i in asked:
            text = squad.questions[i].text
            gold = texts.index(squad.contexts[squad.questions[i].paragraph])
            item = Question(plain.scores(text), mixed.features(text), gold)
            (unseen if title in held else fit).append(item)
    return fit, unseen


def log_likelihood(items: list[Question], weights: np.ndarray) -> float:
    """The mean log-probability of the gold paragraphs under ``softmax(features @ weights)``."""
    total = 0.0
    for q in items:
        z = q.features @ weights
        total += float(z[q.gold] - z.max() - np.log(np.exp(z - z.max()).sum()))
    return total / len(items)


def fit(items: list[Question]) -> np.ndarray:
    """``[3]``: the weights maximising :func:`log_likelihood` (beta folded in)."""
    data = [(torch.from_numpy(q.features), q.gold) for q in items]
    weights = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([weights], max_iter=500, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = -sum(torch.log_softmax(f @ weights, 0)[g] for f, g in data) / len(data)
        loss.backward()
        return loss

    optimizer.step(closure)
    return weights.detach().numpy()


def recall(scores: list[np.ndarray], golds: list[int]) -> dict[str, float]:
    """Top-k recall (%) of the gold paragraphs, ties broken in article order."""
    places = []
    for s, g in zip(scores, golds, strict=True):
        places.append(int(np.argsort(-s, kind="stable").tolist().index(g)))
    return {f"top{k}": round(100 * float(np.mean([p < k for p in places])), 1) for k in KS}


def report(items: list[Question], fitted: np.ndarray) -> dict[str, object]:
    """The recall of each ranker on ``items`` and bm25-proximity's log-likelihood."""
    golds = [q.gold for q in items]
    library = np.array([ranking.WORDS_WEIGHT, ranking.PAIRS_WEIGHT, ranking.PROXIMITY_WEIGHT])
    return {
        "questions": len(items),
        "bm25": recall([q.bm25 for q in items], golds),
        "bm25-proximity, fitted": recall([q.features @ fitted for q in items], golds),
        "bm25-proximity, library": recall([q.features @ library for q in items], golds),
        "log_likelihood, fitted": round(log_likelihood(items, fitted), 4),
        "log_likelihood, library": round(log_likelihood(items, RANKER_WEIGHT * library), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_split_arguments(parser)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    squad, held = read_split(args)
    fit_set, unseen = questions(squad, held)
    fitted = fit(fit_set)
    weights = {
        name: round(float(w / RANKER_WEIGHT), 4)
        for name, w in zip(
            ("WORDS_WEIGHT", "PAIRS_WEIGHT", "PROXIMITY_WEIGHT"), fitted, strict=True
        )
    }
    result = {f"weights at beta {RANKER_WEIGHT:g}": weights, "fit": report(fit_set, fitted)}
    if unseen:
        result["unseen"] = report(unseen, fitted)
    print(json.dumps(result, indent=1))
    if args.json:
        machine = {"python": platform.python_version(), "machine": platform.machine()}
        record = {"file": str(args.file), "held_out": sorted(held), "machine": machine}
        args.json.write_text(json.dumps(record | result, indent=1) + "\n")


if __name__ == "__main__":
    main()
