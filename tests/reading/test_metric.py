"""SQuAD's official metric against hand-computed cases (docs/reading.md §4)."""

from __future__ import annotations

import pytest

from relmem.tasks.reading.metric import (
    exact_match,
    f1_score,
    normalize_answer,
    score_predictions,
    squad_scores,
)


@pytest.mark.parametrize(
    ("text", "normal"),
    [
        ("The Denver Broncos!", "denver broncos"),
        ("  a   cat,  an apple;   the end ", "cat apple end"),
        ("theatre anthem", "theatre anthem"),  # articles only as whole words
        ("U.S.-based", "usbased"),  # punctuation removed, not replaced by a space
        ("An", ""),
    ],
)
def test_normalisation(text: str, normal: str) -> None:
    assert normalize_answer(text) == normal


def test_exact_match_and_f1_by_hand() -> None:
    assert exact_match("the Broncos", "Broncos.") == 1.0
    assert exact_match("Denver Broncos", "Broncos") == 0.0
    # prediction "denver broncos team" vs "broncos": common 1, P 1/3, R 1, F1 = 0.5
    assert f1_score("Denver Broncos team", "the Broncos") == pytest.approx(0.5)
    # repeated tokens count as a multiset: "a b b" vs "b b c" -> "b b" common, P = R = 2/3
    assert f1_score("x y y", "y y z") == pytest.approx(2 / 3)
    assert f1_score("nothing here", "Broncos") == 0.0
    assert f1_score("", "") == 1.0  # v2.0: both empty
    assert f1_score("the", "Broncos") == 0.0  # normalises to nothing


def test_best_reference_counts() -> None:
    em, f1 = squad_scores("Denver", ["Denver Broncos", "the Broncos", "Denver"])
    assert (em, f1) == (1.0, 1.0)
    em, f1 = squad_scores("Broncos team", ["Denver Broncos", "Broncos of Denver"])
    assert em == 0.0 and f1 == pytest.approx(0.5)


def test_dataset_scores_missing_predictions_and_v2_split() -> None:
    references = {"a": ["Paris"], "b": ["two", "2"], "c": [], "d": []}
    predictions = {"a": "paris.", "c": "", "d": "London"}  # b missing: scores 0
    scores = score_predictions(references, predictions)
    assert scores["total"] == 4
    assert scores["exact_match"] == pytest.approx(50.0)  # a and c
    assert scores["f1"] == pytest.approx(50.0)
    assert scores["HasAns_total"] == 2 and scores["HasAns_f1"] == pytest.approx(50.0)
    assert scores["NoAns_total"] == 2 and scores["NoAns_exact_match"] == pytest.approx(50.0)


def test_v1_scores_have_no_split() -> None:
    scores = score_predictions({"a": ["x"]}, {"a": "x"})
    assert scores == {"exact_match": 100.0, "f1": 100.0, "total": 1.0}
