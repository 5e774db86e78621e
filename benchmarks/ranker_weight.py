"""Fit the ranker's weight beta (``--task.ranker-weight``, ``RANKER_WEIGHT``) by likelihood.

The ranker's probability that paragraph p of the K an article's question reads holds its
answer is ``softmax(beta * score)`` over those K (``--ranker``: ``bm25``, whose beta this fit
chose, or ``bm25-proximity``, whose weights ``benchmarks/ranker_fit.py`` fit at beta 0.7);
beta maximises the log-likelihood of the gold paragraphs of a SQuAD-layout file's answerable
questions whose gold is among their K best (the objective is concave in beta: Newton's method
from 0.5). With ``--held-out-articles``
the held-out articles (drawn as ``relmem train squad`` draws them) are left out of the fit and
scored apart: their log-likelihood at the fitted beta and the beta they alone would give,
which says how well the fit carries to unseen articles. Prints one line per K and, with
``--json``, one object per K with the machine.

    python benchmarks/ranker_weight.py --file train-v1.1-first-articles.json \\
        --held-out-articles 0.2 --split-seed 0 --k 4 8 0
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import numpy as np

from relmem.tasks.reading.articles import rank_in_articles
from relmem.tasks.reading.ranking import RANKERS, Ranker
from relmem.tasks.reading.sources import held_out_articles
from relmem.tasks.reading.squad import SquadFile, read_squad


def candidates(squad: SquadFile, k: int, held: set[str], ranker: Ranker) -> tuple[list, list]:
    """``(fit, unseen)``: per answerable question of ``squad`` whose gold paragraph is among
    its ``k`` best (0: all), ``(scores [k], gold position)``, split by its article's title."""
    answerable = [i for i, q in enumerate(squad.questions) if q.answerable]
    fit, unseen = [], []
    for i, ranking in rank_in_articles(squad, answerable, ranker).items():
        read = ranking.paragraphs[:k] if k else ranking.paragraphs
        own = squad.questions[i].paragraph
        if own in read:
            item = (np.array(ranking.scores[: len(read)]), read.index(own))
            (unseen if squad.titles[own] in held else fit).append(item)
    return fit, unseen


def log_likelihood(beta: float, items: list) -> tuple[float, float, float]:
    """The mean log-likelihood of ``items`` at ``beta``, and its first and second
    derivatives."""
    value = first = second = 0.0
    for scores, gold in items:
        z = beta * scores
        e = np.exp(z - z.max())
        p = e / e.sum()
        mean = float(p @ scores)
        value += float(z[gold] - z.max() - np.log(e.sum()))
        first += float(scores[gold]) - mean
        second -= float(p @ scores**2) - mean**2
    n = len(items)
    return value / n, first / n, second / n


def fit_beta(items: list) -> float:
    """The beta maximising :func:`log_likelihood` (Newton's method, kept at >= 0)."""
    beta = 0.5
    for _ in range(50):
        _, first, second = log_likelihood(beta, items)
        step = first / second if second < 0 else -first
        beta = max(beta - step, 0.0)
        if abs(step) < 1e-8:
            break
    return beta


def add_split_arguments(parser: argparse.ArgumentParser) -> None:
    """``--file``, ``--held-out-articles`` and ``--split-seed`` (:func:`read_split`'s); also
    :mod:`ranker_fit`'s."""
    parser.add_argument("--file", type=Path, required=True, help="a SQuAD-layout file")
    parser.add_argument("--held-out-articles", type=float, default=None)
    parser.add_argument("--split-seed", type=int, default=0)


def read_split(args: argparse.Namespace) -> tuple[SquadFile, set[str]]:
    """The file ``--file`` and the titles of its held-out articles, drawn as ``relmem train
    squad`` draws them (none without ``--held-out-articles``)."""
    squad = read_squad(args.file)
    if args.held_out_articles is None:
        return squad, set()
    return squad, held_out_articles(squad, args.held_out_articles, args.split_seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_split_arguments(parser)
    parser.add_argument("--k", type=int, nargs="+", default=[4], help="paragraphs read (0: all)")
    parser.add_argument("--ranker", choices=RANKERS, default="bm25")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    squad, held = read_split(args)
    results = []
    for k in args.k:
        fit, unseen = candidates(squad, k, held, args.ranker)
        beta = fit_beta(fit)
        line = {"k": k, "questions": len(fit), "beta": round(beta, 4),
                "log_likelihood": round(log_likelihood(beta, fit)[0], 4)}  # fmt: skip
        if unseen:
            line |= {
                "unseen_questions": len(unseen),
                "unseen_log_likelihood": round(log_likelihood(beta, unseen)[0], 4),
                "unseen_beta": round(fit_beta(unseen), 4),
            }
        print(json.dumps(line))
        results.append(line)
    if args.json:
        machine = {"python": platform.python_version(), "machine": platform.machine()}
        args.json.write_text(
            json.dumps(
                {
                    "file": str(args.file),
                    "ranker": args.ranker,
                    "held_out": sorted(held),
                    "machine": machine,
                    "results": results,
                },
                indent=1,
            )
            + "\n"  # fmt: skip
        )


if __name__ == "__main__":
    main()
