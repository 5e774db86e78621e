"""Reading SQuAD-layout files: offsets, alignment, caches, splits, bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from relmem.tasks.reading.data import (
    CACHE_DIR,
    PAD,
    UNK,
    EncodedSplit,
    Vocabulary,
    load_vocabulary,
    read_tokenized,
)
from relmem.tasks.reading.embeddings import read_word_vectors
from relmem.tasks.reading.squad import SquadError, align, read_squad, tokenize
from relmem.tasks.reading.task import Reading, ReadingConfig


def test_offsets_round_trip_every_answer(squad_dir: Path) -> None:
    """Each token is its offsets' slice, and every aligned answer's token span maps back to
    the reference's exact text (the sample's answers all start and end on token edges)."""
    text = read_tokenized(squad_dir / "sample-v2.0.json")
    vocabulary = load_vocabulary(text, 1, 1)
    encoded = EncodedSplit(text, vocabulary, 8)
    assert encoded.stats(40).unaligned == 0 and encoded.stats(40).inexact == 0
    for i, question in enumerate(text.squad.questions):
        first, last = encoded.gold[i].tolist()
        if not question.answerable:
            assert (first, last) == (-1, -1)
            continue
        answer, start, end = encoded.answer_text(i, first, last)
        assert answer == question.answers[0]
        assert start == question.answer_starts[0] and end == start + len(answer)


def test_tokens_keep_case_and_spacing() -> None:
    text = "Bobby  Fischer's 1988 patent—U.S. No. 4,884,255."
    spans = tokenize(text)
    words = [text[s:e] for s, e in spans]
    assert words[:4] == ["Bobby", "Fischer", "'", "s"]
    assert "".join(words) == "".join(text.split())
    assert align(spans, text.index("1988"), text.index("1988") + 4) == (4, 4)
    assert align(spans, 5, 7) is None  # whitespace only


def test_an_answer_inside_a_token_is_counted_inexact(tmp_path: Path) -> None:
    context = "The goldsmith arrived."
    qa = {"id": "1", "question": "Who?", "answers": [{"text": "gold", "answer_start": 4}]}
    record = {"title": "t", "paragraphs": [{"context": context, "qas": [qa]}]}
    path = tmp_path / "f.json"
    path.write_text(json.dumps({"data": [record]}))
    text = read_tokenized(path)
    encoded = EncodedSplit(text, load_vocabulary(text, 1, 1), 8)
    assert encoded.stats(40).inexact == 1
    assert encoded.answer_text(0, *encoded.gold[0].tolist())[0] == "goldsmith"


def test_the_cache_follows_the_content_not_size_or_time(squad_dir: Path) -> None:
    path = squad_dir / "dev-v1.1.json"
    first = read_tokenized(path)
    assert len(list((squad_dir / CACHE_DIR).glob("dev-v1.1.json.*.tokens.safetensors"))) == 1
    stat = path.stat()
    edited = path.read_text().replace("eleven miles", "eleven-miles")  # same size
    path.write_text(edited)
    import os

    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size
    second = read_tokenized(path)
    assert second.sha1 != first.sha1
    assert second.context_text.count("-") == first.context_text.count("-") + 1


def test_a_damaged_cache_is_made_again(squad_dir: Path) -> None:
    path = squad_dir / "dev-v1.1.json"
    first = read_tokenized(path)
    (cache,) = (squad_dir / CACHE_DIR).glob("*.tokens.safetensors")
    cache.write_bytes(b"not a safetensors file")
    again = read_tokenized(path)
    assert torch.equal(again.tokens.context_spans, first.tokens.context_spans)


def test_held_out_articles_are_disjoint_and_left_out_of_the_vocabulary(squad_dir: Path) -> None:
    config = ReadingConfig(
        train_file=squad_dir / "train-v1.1.json", held_out_articles=0.34, min_char_count=1
    )
    task = Reading(config)
    squad = task.train.squad
    train_titles = {squad.titles[squad.questions[i].paragraph] for i in task.train_index.tolist()}
    held_titles = {squad.titles[squad.questions[i].paragraph] for i in task.held_index.tolist()}
    assert len(held_titles) == 1 and not train_titles & held_titles
    held_only = {"Lighthouses": "stevenson", "Honey bees": "frisch", "Chess clocks": "fischer"}
    word = held_only[next(iter(held_titles))]
    assert word not in task.vocabulary.words
    other = Reading(ReadingConfig(train_file=config.train_file, held_out_articles=0.34))
    assert torch.equal(other.held_index, task.held_index)  # the seed fixes the split


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"version": "1.1"}, "has no 'data'"),
        ({"data": [{"title": "t", "paragraphs": [{"context": " ", "qas": []}]}]}, "is empty"),
        ({"data": [{"paragraphs": [{"context": "abc", "qas": [{"question": "q?"}]}]}]},
         "data[0].paragraphs[0].qas[0]: has no 'id'"),
        ({"data": [{"paragraphs": [{"context": "abc", "qas": [
            {"id": "x", "question": "q", "answers": [{"text": "b", "answer_start": 1}]},
            {"id": "x", "question": "q", "answers": [{"text": "b", "answer_start": 1}]}]}]}]},
         "repeats the id of data[0].paragraphs[0].qas[0]"),
        ({"data": [{"paragraphs": [{"context": "abc", "qas": [
            {"id": "x", "question": "q", "answers": [{"text": "b", "answer_start": 7}]}]}]}]},
         "answers[0].answer_start: 7 (answer of 1 characters) lies outside its context"),
    ],
)  # fmt: skip
def test_bad_files_name_the_file_and_the_record(tmp_path: Path, document, message) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    with pytest.raises(SquadError) as error:
        read_squad(path)
    assert str(path) in str(error.value) and message in str(error.value)


def test_non_utf8_and_non_json_files(tmp_path: Path) -> None:
    path = tmp_path / "latin1.json"
    path.write_bytes('{"data": "caf\xe9"}'.encode("latin-1"))
    with pytest.raises(SquadError, match="not UTF-8"):
        read_squad(path)
    path.write_text("{not json")
    with pytest.raises(SquadError, match="not JSON"):
        read_squad(path)


def test_glove_vectors_restricted_to_the_vocabulary(tmp_path: Path) -> None:
    vocabulary = Vocabulary(("the", "bee", "queen"), ("a",))
    glove = tmp_path / "glove.txt"
    glove.write_text("The 1 1 1\nthe 2 2 2\nBee 3 3 3\nunused 9 9 9\n")
    vectors = read_word_vectors(glove, vocabulary, 3)
    assert vectors.shape == (5, 3)
    assert torch.equal(vectors[0], torch.zeros(3))  # padding
    assert vectors[2].tolist() == [2, 2, 2]  # the lower-cased form wins
    assert vectors[3].tolist() == [3, 3, 3]  # a cased form when no lower-cased one
    glove.write_text("the 1 1\n")
    with pytest.raises(ValueError, match=r"line 1: 2 numbers after the word, expected 3"):
        read_word_vectors(glove, vocabulary, 3)


def test_an_unaligned_answer_is_counted_and_still_evaluated(tmp_path: Path, capsys) -> None:
    good = {"id": "1", "question": "Who?", "answers": [{"text": "Ada", "answer_start": 0}]}
    blank = {"id": "2", "question": "What?", "answers": [{"text": " ", "answer_start": 3}]}
    record = {"title": "t", "paragraphs": [{"context": "Ada wrote it.", "qas": [good, blank]}]}
    path = tmp_path / "f.json"
    path.write_text(json.dumps({"data": [record]}))
    task = Reading(ReadingConfig(train_file=path, dev_file=path, min_char_count=1))
    assert "2 answers (1 not aligned" in capsys.readouterr().err
    assert task.train_index.tolist() == [0]  # nothing to learn from the other
    assert task.held_index.tolist() == [0, 1]  # both scored


def test_the_dataset_option_says_how_to_get_squad_offline(tmp_path: Path, monkeypatch) -> None:
    import sys

    monkeypatch.setenv("RELMEM_DATA", str(tmp_path))
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    with pytest.raises(ValueError) as error:
        Reading(ReadingConfig(dataset="squad"))
    message = str(error.value)
    assert "datasets" in message and "rajpurkar.github.io/SQuAD-explorer" in message
    assert str(tmp_path / "squad") in message


def test_the_exported_vocabulary_round_trips() -> None:
    vocabulary = Vocabulary(("the", "bee"), ("t", "h"))
    record = vocabulary.exported()
    assert record["words"] == ["<pad>", "<unk>", "the", "bee"]  # ids 0 and 1, then id order
    assert record["chars"][PAD] == "<pad>" and record["chars"][UNK] == "<unk>"
    assert Vocabulary.from_exported(record) == vocabulary
