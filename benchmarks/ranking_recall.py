"""Recall of the gold paragraph under each candidate ranker of ``relmem answer --paragraphs``.

Each answerable question of a SQuAD-layout file is ranked among its own article's paragraphs
(v2.0's unanswerable questions are skipped); a ranker's top-k recall is the share of questions
whose own paragraph is among the k best. The candidates: scikit-learn's ``TfidfVectorizer``
(cosine similarity; as it comes, and with English stop words and sublinear term frequency),
``bm25s`` (its default Lucene BM25, and BM25+) and ``rank_bm25`` (Okapi BM25 and BM25+), all
BM25s with k1 1.5 and b 0.75 over the same lower-cased words, and the library's two rankers
(``relmem.tasks.reading.ranking``: ``bm25``, and ``bm25-proximity``, which ``relmem answer``
and article runs use by default; its weights were fit on SQuAD training articles, so measure
it on others). Each missing library's rows are left out. Prints a
Markdown table and, with ``--json``, one JSON object per ranker with the machine.

    python benchmarks/ranking_recall.py --file dev-v1.1.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import re
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from relmem.tasks.reading.ranking import ParagraphIndex
from relmem.tasks.reading.ranking import Ranker as LibraryRanker

KS = (1, 2, 4, 8)
# a ranker: (the article's paragraphs, its questions) -> [questions, paragraphs] scores
Ranker = Callable[[list[str], list[str]], np.ndarray]


def words(text: str) -> list[str]:
    """Lower-cased runs of letters and digits (the tokens the BM25 libraries are given)."""
    return re.findall(r"\w+", text.lower())


def tfidf(**options: object) -> Ranker:
    """scikit-learn's TF-IDF with ``options``, questions scored by cosine similarity."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    def scores(paragraphs: list[str], questions: list[str]) -> np.ndarray:
        vectorizer = TfidfVectorizer(**options)  # type: ignore[arg-type]
        matrix = vectorizer.fit_transform(paragraphs)  # rows L2-normalised: dot = cosine
        return (vectorizer.transform(questions) @ matrix.T).toarray()

    return scores


def bm25s_ranker(method: str) -> Ranker:
    """``bm25s``'s BM25 variant ``method`` over :func:`words`."""
    import bm25s

    def scores(paragraphs: list[str], questions: list[str]) -> np.ndarray:
        retriever = bm25s.BM25(method=method, k1=1.5, b=0.75)
        retriever.index([words(p) for p in paragraphs], show_progress=False)
        return np.stack([retriever.get_scores(words(q)) for q in questions])

    return scores


def rank_bm25_ranker(variant: str) -> Ranker:
    """``rank_bm25``'s class ``variant`` (``BM25Okapi``, ``BM25Plus``) over :func:`words`."""
    import rank_bm25

    def scores(paragraphs: list[str], questions: list[str]) -> np.ndarray:
        index = getattr(rank_bm25, variant)([words(p) for p in paragraphs], k1=1.5, b=0.75)
        return np.stack([index.get_scores(words(q)) for q in questions])

    return scores


def library_ranker(name: LibraryRanker) -> Ranker:
    """The library's ranker ``name`` (:class:`ParagraphIndex`)."""

    def scores(paragraphs: list[str], questions: list[str]) -> np.ndarray:
        index = ParagraphIndex(paragraphs, name)
        return np.stack([index.scores(q) for q in questions])

    return scores


CANDIDATES: dict[str, Callable[[], Ranker]] = {
    "scikit-learn TfidfVectorizer()": lambda: tfidf(),
    "scikit-learn TfidfVectorizer(stop_words='english', sublinear_tf=True)": lambda: tfidf(
        stop_words="english", sublinear_tf=True
    ),
    "bm25s BM25(method='lucene') (its default)": lambda: bm25s_ranker("lucene"),
    "bm25s BM25(method='bm25+')": lambda: bm25s_ranker("bm25+"),
    "rank_bm25 BM25Okapi": lambda: rank_bm25_ranker("BM25Okapi"),
    "rank_bm25 BM25Plus": lambda: rank_bm25_ranker("BM25Plus"),
    "relmem bm25 (ranking.ParagraphIndex)": lambda: library_ranker("bm25"),
    "relmem bm25-proximity (ranking.ParagraphIndex, the default)": lambda: library_ranker(
        "bm25-proximity"
    ),
}


def articles(path: Path) -> list[tuple[list[str], list[tuple[str, int]]]]:
    """Each article's paragraphs and its answerable questions with their paragraph's index."""
    out = []
    for article in json.loads(path.read_text(encoding="utf-8"))["data"]:
        contexts, asked = [], []
        for p, paragraph in enumerate(article["paragraphs"]):
            contexts.append(paragraph["context"])
            asked += [(qa["question"], p) for qa in paragraph["qas"] if not qa.get("is_impossible")]
        out.append((contexts, asked))
    return out


def recall(ranker: Ranker, data: list[tuple[list[str], list[tuple[str, int]]]]) -> list[float]:
    """Top-k recall for each k of :data:`KS` (ties broken against the gold paragraph)."""
    hits, total = np.zeros(len(KS)), 0
    for contexts, asked in data:
        scores = ranker(contexts, [q for q, _ in asked])  # [Q, P]
        gold = np.array([p for _, p in asked])
        gold_score = scores[np.arange(len(asked)), gold]
        rank = (scores >= gold_score[:, None]).sum(axis=1)  # 1: first, counting ties ahead
        hits += [(rank <= k).sum() for k in KS]
        total += len(asked)
    return list(hits / total)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--file", type=Path, required=True, help="a SQuAD-layout JSON file")
    parser.add_argument("--json", type=Path, help="also write one JSON line per ranker here")
    args = parser.parse_args()
    data = articles(args.file)
    sha1 = hashlib.sha1(args.file.read_bytes()).hexdigest()
    questions = sum(len(asked) for _, asked in data)
    every = sum(len(p["qas"]) for a in json.loads(args.file.read_bytes())["data"]
                for p in a["paragraphs"])  # fmt: skip
    paragraphs = sum(len(contexts) for contexts, _ in data)
    print(f"{args.file} (SHA-1 {sha1}): {len(data)} articles, {paragraphs} paragraphs, "
          f"{every} questions of which {questions} answerable; {platform.machine()}, "
          f"Python {platform.python_version()}")  # fmt: skip
    print("\n| ranker | " + " | ".join(f"top-{k}" for k in KS) + " | seconds |")
    print("|---|" + "---:|" * (len(KS) + 1))
    records = []
    for name, make in CANDIDATES.items():
        try:
            ranker = make()
            began = time.perf_counter()
            found = recall(ranker, data)
        except ImportError as exc:
            print(f"| {name} | not installed ({exc.name}) |")
            continue
        seconds = time.perf_counter() - began
        cells = " | ".join(f"{100 * r:.1f}" for r in found)
        print(f"| {name} | {cells} | {seconds:.2f} |")
        records.append({"ranker": name, "recall": dict(zip(KS, found, strict=True)),
                        "seconds": seconds, "file": str(args.file), "sha1": sha1,
                        "questions": questions, "machine": platform.platform()})  # fmt: skip
    if args.json is not None:
        with args.json.open("a", encoding="utf-8") as out:
            out.writelines(json.dumps(r) + "\n" for r in records)


if __name__ == "__main__":
    main()
