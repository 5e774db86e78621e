"""The ``bm25-proximity`` ranker (``relmem.tasks.reading.ranking``): its light stemmer, its
proximity against a brute-force scan of every window, its three scores against BM25+ computed
directly, and what it ranks where BM25+ cannot tell two paragraphs apart."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rank_bm25 import BM25Plus

from relmem.tasks.reading import ranking
from relmem.tasks.reading.ranking import (
    PROXIMITY_WINDOW,
    STOP_WORDS,
    ParagraphIndex,
    proximity,
    stem,
    word_pairs,
    words,
)
from relmem.tasks.reading.task import ReadingConfig
from relmem.train.config import config_from_dict


def test_stem_cuts_one_ending_and_keeps_short_words() -> None:
    assert [stem(w) for w in ("rivers", "classes", "decoded", "building", "bees")] == [
        "river", "class", "decod", "build", "bees",
    ]  # fmt: skip
    assert [stem(w) for w in ("is", "was", "red", "sing", "uses")] == [
        "is", "was", "red", "sing", "uses",
    ]  # fmt: skip


def test_word_pairs_are_adjacent_words() -> None:
    assert word_pairs(["new", "york", "city"]) == ["new york", "york city"]
    assert word_pairs(["alone"]) == []


def brute_proximity(paragraph, question, idf, total) -> float:
    """Every window of PROXIMITY_WINDOW words, scanned in full."""
    best = 0.0
    for start in range(len(paragraph)):
        inside = {t for t in paragraph[start : start + PROXIMITY_WINDOW] if t in question}
        best = max(best, sum(idf[t] for t in inside))
    return best / total


@given(
    st.lists(st.sampled_from("abcdefgh"), max_size=80),
    st.sets(st.sampled_from("abcdefgh"), min_size=1),
)
def test_proximity_equals_the_scan_of_every_window(paragraph, question) -> None:
    idf = {t: 1.0 + ord(t) % 5 for t in "abcdefgh"}
    total = sum(idf[t] for t in question) + 2.0  # with a word absent from the text
    assert proximity(paragraph, question, idf, total) == pytest.approx(
        brute_proximity(paragraph, question, idf, total)
    )


def test_proximity_counts_words_less_than_a_window_apart() -> None:
    idf = {"x": 1.0, "y": 3.0}
    apart = ["x"] + ["z"] * (PROXIMITY_WINDOW - 1) + ["y"]  # y is PROXIMITY_WINDOW words on
    assert proximity(apart, {"x", "y"}, idf, 4.0) == 0.75  # y alone
    assert proximity(apart[1:], {"x", "y"}, idf, 4.0) == 0.75
    near = ["x"] + ["z"] * (PROXIMITY_WINDOW - 2) + ["y"]
    assert proximity(near, {"x", "y"}, idf, 4.0) == 1.0
    assert proximity(["z", "z"], {"x"}, idf, 4.0) == 0.0


TEXTS = [
    "The Rhine flows through Basel and Strasbourg before it reaches Rotterdam.",
    "Rotterdam is a port; the Rhine delta spreads west of Basel, far from Strasbourg.",
    "Bees keep their hives warm in winter.",
]


def test_features_are_bm25_plus_over_content_words_pairs_and_proximity() -> None:
    index = ParagraphIndex(TEXTS, "bm25-proximity")
    question = "Which cities does the Rhine flow through before Rotterdam?"
    got = index.features(question)
    terms = [words(t) for t in TEXTS]
    asked = words(question)
    content = [w for w in asked if w not in STOP_WORDS]
    assert "which" not in content and "rhine" in content
    unigram = BM25Plus(terms, k1=1.5, b=0.75).get_scores(content)
    pairs = BM25Plus([word_pairs(t) for t in terms], k1=1.5, b=0.75).get_scores(word_pairs(asked))
    assert got.shape == (3, 3)
    np.testing.assert_allclose(got[:, 0], unigram)
    np.testing.assert_allclose(got[:, 1], pairs)
    # proximity by hand for the first text: idf log((P + 1) / paragraphs holding the stem)
    stems = [[stem(w) for w in t] for t in terms]
    idf = {s: math.log(4 / sum(s in t for t in stems)) for t in stems for s in t}
    asked_stems = {stem(w) for w in content}
    total = sum(idf.get(s, math.log(4)) for s in asked_stems)
    present = {s for s in asked_stems if s in idf}
    assert got[0, 2] == pytest.approx(proximity(stems[0], present, idf, total))
    assert got[2, 2] == 0.0  # no word of the question in the bees' paragraph
    weights = [ranking.WORDS_WEIGHT, ranking.PAIRS_WEIGHT, ranking.PROXIMITY_WEIGHT]
    np.testing.assert_allclose(index.scores(question), got @ np.array(weights))


def test_a_question_of_stop_words_only_keeps_its_words() -> None:
    index = ParagraphIndex(["What is it?", "It was not."], "bm25-proximity")
    assert index.features("what is it")[:, 0].tolist() == pytest.approx(
        BM25Plus([["what", "is", "it"], ["it", "was", "not"]], k1=1.5, b=0.75).get_scores(
            ["what", "is", "it"]
        )
    )


def test_words_standing_together_rank_first_where_bm25_ties() -> None:
    together = "the treaty of paris was signed in a hall near the old river bridge today"
    # the same words in another order: paris and signed far from the treaty
    scattered = "paris was in a hall near the old river bridge today the treaty of signed"
    assert sorted(scattered.split()) == sorted(together.split())
    question = "Where was the treaty of Paris signed?"
    plain = ParagraphIndex([scattered, together], "bm25").scores(question)
    assert plain[0] == pytest.approx(plain[1])  # the same words, the same length
    assert ParagraphIndex([scattered, together], "bm25-proximity").top(question, 1) == [1]


def test_bm25_is_bm25_plus_over_every_word() -> None:
    index = ParagraphIndex(TEXTS, "bm25")
    question = "Which cities does the Rhine flow through?"
    expected = BM25Plus([words(t) for t in TEXTS], k1=1.5, b=0.75).get_scores(words(question))
    np.testing.assert_allclose(index.scores(question), expected)
    with pytest.raises(ValueError, match="the bm25 ranker has none"):
        index.features(question)


def test_an_unknown_ranker_is_refused() -> None:
    with pytest.raises(ValueError, match="ranker must be one of bm25, bm25-proximity, got 'tfidf'"):
        ParagraphIndex(TEXTS, "tfidf")  # type: ignore[arg-type]


def test_a_config_without_a_ranker_means_bm25() -> None:
    new = ReadingConfig()  # a new run's
    assert (new.ranker, new.training_ranker) == ("bm25-proximity", "bm25")
    old = config_from_dict(ReadingConfig, {})  # a config.json from before
    assert (old.ranker, old.training_ranker) == ("bm25", "bm25")
    for ranker in ("bm25", "bm25-proximity"):
        given = config_from_dict(ReadingConfig, {"ranker": ranker, "training_ranker": ranker})
        assert (given.ranker, given.training_ranker) == (ranker, ranker)
