"""SQuAD's official answer metric: exact match and token F1 (``docs/reading.md`` §4).

The same normalisation and scores as the official v1.1 and v2.0 evaluation scripts: lower-case,
strip every character of :data:`string.punctuation`, drop the whole words ``a``, ``an`` and
``the``, collapse whitespace; a question scores the best over its reference answers; a v2.0
question without answers has the single reference ``""``, and F1 is 1 when prediction and
reference both normalise to nothing, 0 when only one does.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence

__all__ = ["exact_match", "f1_score", "normalize_answer", "score_predictions", "squad_scores"]

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
    """``text`` lower-cased, without punctuation and articles, whitespace collapsed."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, reference: str) -> float:
    """1.0 when both normalise to the same string, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(reference))


def f1_score(prediction: str, reference: str) -> float:
    """Token F1 between the normalised strings (1.0 when both are empty, 0.0 when one is)."""
    predicted = normalize_answer(prediction).split()
    gold = normalize_answer(reference).split()
    if not predicted or not gold:
        return float(predicted == gold)
    common = sum((Counter(predicted) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def squad_scores(prediction: str, references: Sequence[str]) -> tuple[float, float]:
    """``(exact match, F1)`` of one question: the best over ``references``.

    As v2.0's script, references that normalise to nothing are dropped and a question left
    without any is scored against ``""`` (v1.1's references never normalise to nothing).
    """
    references = [r for r in references if normalize_answer(r)] or [""]
    return (
        max(exact_match(prediction, r) for r in references),
        max(f1_score(prediction, r) for r in references),
    )


def score_predictions(
    references: Mapping[str, Sequence[str]], predictions: Mapping[str, str]
) -> dict[str, float]:
    """The official figures of ``predictions {id: text}`` on ``references {id: [texts]}``.

    A question missing from ``predictions`` scores 0. Returns ``exact_match`` and ``f1`` (in
    percent, over every question), ``total``, and for a set with unanswerable questions (an
    empty reference list) the same split into ``HasAns_*`` and ``NoAns_*``, as v2.0's script.
    """
    rows = {"all": [], "HasAns": [], "NoAns": []}
    for qid, answers in references.items():
        em, f1 = squad_scores(predictions[qid], answers) if qid in predictions else (0.0, 0.0)
        rows["all"].append((em, f1))
        rows["HasAns" if answers else "NoAns"].append((em, f1))

    def summary(pairs: list[tuple[float, float]], prefix: str) -> dict[str, float]:
        count = len(pairs)
        return {
            f"{prefix}exact_match": 100.0 * sum(p[0] for p in pairs) / max(count, 1),
            f"{prefix}f1": 100.0 * sum(p[1] for p in pairs) / max(count, 1),
            f"{prefix}total": float(count),
        }

    result = summary(rows["all"], "")
    if rows["NoAns"]:
        result |= summary(rows["HasAns"], "HasAns_") | summary(rows["NoAns"], "NoAns_")
    return result
