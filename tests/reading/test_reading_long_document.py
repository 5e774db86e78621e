"""``relmem answer`` on a long document (issue 42): the text cut into paragraphs, ranked against
the question, the best few read; bad input refused with one line and exit status 2."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from reading_sample import Spotter, train_args
from tokenizers.pre_tokenizers import BertPreTokenizer

from relmem import cli
from relmem.tasks.reading import answer, load_reader
from relmem.tasks.reading.answer import AnswerReader, top_spans
from relmem.tasks.reading.data import Vocabulary
from relmem.tasks.reading.ranking import (
    RANKERS,
    Paragraph,
    ParagraphIndex,
    Ranker,
    split_paragraphs,
)
from relmem.tasks.reading.task import ReadingConfig

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "squad" / "sample-v1.1.json"
CONTEXTS = [
    p["context"] for a in json.loads(SAMPLE.read_text())["data"] for p in a["paragraphs"]
]  # the sample's six paragraphs: a lighthouse, its keepers, bees (two), chess clocks (two)


def test_paragraphs_keep_their_offsets_and_lines() -> None:
    text = "\n  \nFirst line\nsecond line.\n\n\n\t Second para.\r\n\r\nThird\n \n"
    assert split_paragraphs(text) == [
        Paragraph("First line\nsecond line.", 4, 3),
        Paragraph("Second para.", 32, 7),
        Paragraph("Third", 48, 9),
    ]
    for p in split_paragraphs(text):
        assert text[p.start : p.start + len(p.text)] == p.text
        assert p.line == text.count("\n", 0, p.start) + 1
    assert split_paragraphs(" \n\n \t\n") == []


def test_a_long_paragraph_is_cut_at_sentences_then_words() -> None:
    text = "Intro.\n\nOne two three. Four five six seven. Eight\nnine. Ten"
    windows = split_paragraphs(text, max_tokens=6)
    assert [w.text for w in windows] == [
        "Intro.", "One two three.", "Four five six seven.", "Eight\nnine. Ten",
    ]  # fmt: skip
    assert [(w.start, w.line) for w in windows] == [(0, 1), (8, 3), (23, 3), (44, 3)]
    # a sentence's end in the window's first half is not a cut: words are
    assert [w.text for w in split_paragraphs("A. b c d e f g", 6)] == ["A. b c d e", "f g"]
    # no sentence end in a window's second half: cut between words; no space: cut anywhere
    assert [w.text for w in split_paragraphs("a b c d e f g", 4)] == ["a b c d", "e f g"]
    assert [w.text for w in split_paragraphs("a,b,c,d", 3)] == ["a,b", ",c,", "d"]


def test_a_5_mb_line_is_cut_into_bounded_windows() -> None:
    line = " ".join(CONTEXTS) + " "
    text = (line * (5_000_000 // len(line) + 1))[:5_000_000]
    windows = split_paragraphs(text, max_tokens=400)
    assert len(windows) > 5_000_000 / (400 * 8)
    for w in windows:
        assert text[w.start : w.start + len(w.text)] == w.text and w.line == 1
    assert re.sub(r"\s", "", "".join(w.text for w in windows)) == re.sub(r"\s", "", text)
    tokens = BertPreTokenizer()
    for w in windows[:50]:  # the reader's tokens, bounded (counting them all takes seconds)
        assert len(tokens.pre_tokenize_str(w.text)) <= 400
    assert sum(w.text.endswith(".") for w in windows) > 0.9 * len(windows)


@pytest.mark.parametrize("ranker", RANKERS)
def test_the_gold_paragraph_ranks_first(ranker: Ranker) -> None:
    index = ParagraphIndex(CONTEXTS, ranker)
    for question, gold in [
        ("Who built the Bell Rock Lighthouse?", 0),
        ("Where did the keepers' families live?", 1),
        ("How many eggs can the queen lay in a day?", 2),
        ("Who decoded the waggle dance?", 3),
        ("When did Fischer patent the increment?", 5),
    ]:
        assert index.top(question, 1) == [gold], question
        assert index.scores(question).shape == (len(CONTEXTS),)
    assert sorted(index.top("bees", 0)) == list(range(len(CONTEXTS)))
    assert len(index.top("bees", 100)) == len(CONTEXTS)
    repeated = ParagraphIndex([CONTEXTS[0], CONTEXTS[3], CONTEXTS[0]], ranker)
    assert repeated.top("Who built the Bell Rock Lighthouse?", 0) == [0, 1]  # the copy: once


def test_top_spans_are_disjoint_and_best_first() -> None:
    logits = torch.full((1 + 6, 2), -5.0)
    logits[0] = float("-inf")  # no "no answer"
    logits[1 + 1, 0], logits[1 + 2, 1] = 3.0, 3.0  # tokens 1-2: 6
    logits[1 + 4, 0], logits[1 + 4, 1] = 2.0, 1.0  # token 4: 3
    logits[1 + 5, 0], logits[1 + 5, 1] = 0.5, 0.5  # token 5: 1 (tokens 4-5, 2.5: overlaps)
    assert top_spans(logits, max_tokens=3, n=3) == [(1, 2, 6.0), (4, 4, 3.0), (5, 5, 1.0)]
    assert top_spans(logits, max_tokens=3, n=1) == [(1, 2, 6.0)]


def test_no_answer_only_when_every_paragraph_read_prefers_it() -> None:
    # a reader that scores "karl" (id 2) 5 as start and end, every other token 0 and "no
    # answer" 1.5 + 1.5 (as a reader trained with unanswerable questions)
    spotter = Spotter({2: 5.0}, other=0.0, null=1.5)
    reader = AnswerReader(Vocabulary(("karl",), ("a",)), ReadingConfig(), spotter)
    text = "Nothing here.\n\nKarl decoded it.\n\nNor here."
    result = reader(text, "Who?", paragraphs=0, top=2)
    assert not isinstance(result, list)
    assert (result.text, result.paragraph, result.line, result.score) == ("Karl", 1, 3, 10.0)
    # one softmax over the three paragraphs: 3 "no answer" positions, Karl and 9 other tokens
    norm = 3 * math.exp(1.5) + math.exp(5) + 9
    assert result.probability == pytest.approx((math.exp(5) / norm) ** 2)
    (second,) = result.alternatives  # "no answer" (3) beats every other span (0)
    assert (second.text, second.start, second.paragraph, second.line) == ("", -1, -1, 0)
    assert second.probability == pytest.approx((math.exp(1.5) / norm) ** 2)
    none = reader("Nothing here.\n\nNor here.", "Who?", paragraphs=0)
    assert not isinstance(none, list)
    assert (none.text, none.start, none.score) == ("", -1, 3.0)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A tiny reader trained on the sample (once for this module)."""
    root = tmp_path_factory.mktemp("run")
    folder = root / "squad"
    folder.mkdir()
    for name in ("train-v1.1.json", "dev-v1.1.json"):
        folder.joinpath(name).write_bytes(SAMPLE.read_bytes())
    assert cli.main(train_args(folder, root, "run", "--model", "none", "--steps", "2")) == 0
    return root / "run"


def _document(copies: int = 20) -> str:
    """The sample's paragraphs with numbered filler paragraphs between them, blank-line
    separated, some paragraphs over several lines."""
    filler = [f"Filler paragraph {i} says\nnothing about anything at all." for i in range(copies)]
    return "\n\n".join(filler[: copies // 2] + CONTEXTS + filler[copies // 2 :]) + "\n"


def _check(result, text: str) -> None:
    """``result`` (an answer and its alternatives) stands in ``text`` where it says."""
    parts = split_paragraphs(text)
    for a in (result, *result.alternatives):
        assert text[a.start : a.end] == a.text and a.text
        assert a.line == text.count("\n", 0, a.start) + 1
        part = parts[a.paragraph]
        assert part.start <= a.start and a.end <= part.start + len(part.text)
    texts = [a.text for a in (result, *result.alternatives)]
    assert len(set(texts)) == len(texts)
    scores = [a.score for a in (result, *result.alternatives)]
    assert scores == sorted(scores, reverse=True)


def test_answer_a_long_text_from_python(run: Path) -> None:
    text = _document()
    question = "Who decoded the waggle dance?"
    result = answer(run, text, question, paragraphs=2, top=3)
    assert len(result.alternatives) == 2
    read = ParagraphIndex([p.text for p in split_paragraphs(text)]).top(question, 2)
    assert read[0] == 13  # the waggle dance's paragraph
    assert {a.paragraph for a in (result, *result.alternatives)} <= set(read)
    _check(result, text)
    reader = load_reader(run)
    every = reader(text, ["Who decoded the waggle dance?", "When?"], paragraphs=0, top=4)
    assert isinstance(every, list) and len(every) == 2
    for result in every:
        _check(result, text)
    one = reader(CONTEXTS[3], "Who decoded the waggle dance?")  # as before: one paragraph
    assert not isinstance(one, list) and one.paragraph == 0 and one.line == 1
    assert one.alternatives == () and 0 < one.probability <= 1


def test_answer_a_long_file_from_the_command_line(run: Path, tmp_path: Path, capsys) -> None:
    text = _document()
    path = tmp_path / "long.txt"
    path.write_text(text)
    question = "How many eggs can the queen lay in a day?"
    args = ["answer", str(run), "--context", str(path), "--question", question]
    capsys.readouterr()
    assert cli.main([*args, "--top", "3", "--paragraphs", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"Q: {question}" and out[1].startswith("A: ")
    expected = answer(run, text, question, paragraphs=1, top=3)
    assert f"line {expected.line}, paragraph {expected.paragraph + 1}" in out[1]
    assert f"score {expected.score:.2f}" in out[1]
    assert [line[:4] for line in out[4:]] == [" 2. ", " 3. "]
    assert expected.paragraph == 12  # the queen's paragraph, the only one read (10 fillers first)
    # more paragraphs than there are: all read
    assert cli.main([*args, "--paragraphs", "1000"]) == 0
    assert capsys.readouterr().out.startswith(f"Q: {question}\nA: ")
    # the ranker's weight as asked: its bonus is in every score (the best read paragraph's 0)
    assert cli.main([*args, "--paragraphs", "0", "--ranker-weight", "0"]) == 0
    reader = load_reader(run)
    reader.config = replace(reader.config, ranker_weight=0.0)
    expected = reader(text, question, paragraphs=0)
    assert not isinstance(expected, list)
    assert f"score {expected.score:.2f}" in capsys.readouterr().out.splitlines()[1]


def test_a_5_mb_line_and_repeated_paragraphs_are_answered(
    run: Path, tmp_path: Path, capsys
) -> None:
    line = " ".join(CONTEXTS) + " "
    path = tmp_path / "one-line.txt"
    path.write_text((line * (5_000_000 // len(line) + 1))[:5_000_000])
    capsys.readouterr()
    args = ["answer", str(run), "--context", str(path), "--question", "Who decoded the dance?"]
    assert cli.main([*args, "--top", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("A: ") and "  line 1, paragraph " in out[1]
    assert out[4].startswith(" 2. ") and len(out) == 5
    reader = load_reader(run)
    repeated = "\n\n".join([CONTEXTS[3]] * 5 + [CONTEXTS[0]] * 5)
    result = reader(repeated, "Who decoded the waggle dance?", paragraphs=0, top=5)
    assert not isinstance(result, list)
    _check(result, repeated)
    # each distinct paragraph read once: answers from the first copy of each
    assert {a.paragraph for a in (result, *result.alternatives)} <= {0, 5}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--paragraphs", "-1"],
         "--paragraphs -1: read at least 1 paragraph, or pass 0 to read them all"),
        (["--top", "0"], "--top 0: print at least the best answer (--top 1)"),
        (["--ranker-weight", "-0.5"],
         "--ranker-weight must be a finite number >= 0 (0: the reader's choice alone), got -0.5"),
    ],
)  # fmt: skip
def test_bad_counts_are_refused(run: Path, tmp_path: Path, capsys, options, message) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("Karl von Frisch decoded the dance.")
    before = sorted(p.name for p in run.iterdir())
    capsys.readouterr()
    args = ["answer", str(run), "--context", str(path), "--question", "Who?", *options]
    assert cli.main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip().splitlines() == [f"relmem answer: error: {message}"]
    assert sorted(p.name for p in run.iterdir()) == before


def test_a_document_of_only_whitespace_is_refused(run: Path, tmp_path: Path, capsys) -> None:
    path = tmp_path / "blank.txt"
    path.write_text("\n \n\t\n\n")
    capsys.readouterr()
    assert cli.main(["answer", str(run), "--context", str(path), "--question", "Who?"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert captured.out == "" and len(err) == 1
    assert err[0] == f"relmem answer: error: --context {path}: the file holds no text; pass a " \
                     "text to read"  # fmt: skip
    with pytest.raises(ValueError, match="^paragraphs is -1"):
        load_reader(run)("Karl decoded it.", "Who?", paragraphs=-1)
    with pytest.raises(ValueError, match="^top is 0"):
        load_reader(run)("Karl decoded it.", "Who?", top=0)
