"""Bad input to the reading task (issue 43): each case is refused with one line that names the
file, the record or the option, and the fix; from the command line, exit status 2 and nothing
written."""

from __future__ import annotations

import copy
import importlib
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from reading_sample import train_args
from tqdm import tqdm

from relmem import cli
from relmem.tasks.reading import sources
from relmem.tasks.reading.answer import AnswerReader, ticking
from relmem.tasks.reading.data import CACHE_DIR, Vocabulary, write_cache
from relmem.tasks.reading.embeddings import read_word_vectors
from relmem.tasks.reading.squad import SquadError, read_squad
from relmem.tasks.reading.task import Reading, ReadingConfig

# the module (the package's ``answer`` is its function)
answer_module = importlib.import_module("relmem.tasks.reading.answer")
SAMPLE = Path(__file__).resolve().parents[1] / "data" / "squad" / "sample-v1.1.json"


def _every_question(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [q for a in document["data"] for p in a["paragraphs"] for q in p["qas"]]


def _first(edit: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    """``edit`` applied to data[1].paragraphs[0].qas[2] only."""
    return lambda document: edit(document["data"][1]["paragraphs"][0]["qas"][2])


def _all(edit: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    """``edit`` applied to every question."""
    return lambda document: [edit(q) for q in _every_question(document)]


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda record: record.__setitem__(key, value)


def _shift_start(qa: dict[str, Any]) -> None:
    qa["answers"][0]["answer_start"] += 1


def _context(value: str) -> Callable[[dict[str, Any]], None]:
    return lambda document: document["data"][2]["paragraphs"][1].__setitem__("context", value)


Q = "data[1].paragraphs[0].qas[2]"
CASES = {
    # case 1: empty or whitespace-only questions
    "empty question": (_first(_set("question", "")), f"{Q}.question: is empty"),
    "blank questions": (_all(_set("question", " \t")), "data[0].paragraphs[0].qas[0].question"),
    # case 3: answer texts not at answer_start
    "one misplaced answer": (
        _first(_shift_start),
        f"{Q}.answers[0]: the text 'one queen' is not the context's at answer_start 24",
    ),
    "every answer misplaced": (
        _all(_shift_start),
        "(and 17 more of the file's 18 answers): answer_start must be the character offset",
    ),
    # case 4: lone surrogates
    "surrogate in a question": (
        _first(_set("question", "Who\ud800?")),
        f"{Q}.question: holds a lone surrogate ('\\ud800') at character 3",
    ),
    "surrogate in a context": (
        _context("Chess \ud800 clocks"),
        "data[2].paragraphs[1].context: holds a lone surrogate",
    ),
}


def _write(path: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    document = copy.deepcopy(json.loads(SAMPLE.read_text()))
    edit(document)
    path.write_text(json.dumps(document))  # ensure_ascii: a lone surrogate as a \\ud800 escape
    return path


@pytest.mark.parametrize("case", CASES)
def test_read_squad_refuses_with_the_record(tmp_path: Path, case: str) -> None:
    edit, message = CASES[case]
    path = _write(tmp_path / "bad.json", edit)
    with pytest.raises(SquadError) as error:
        read_squad(path)
    text = str(error.value)
    assert "\n" not in text and str(path) in text and message in text, text


@pytest.mark.parametrize("case", CASES)
def test_training_on_a_bad_file_exits_2_and_writes_nothing(
    squad_dir: Path, tmp_path: Path, capsys, case: str
) -> None:
    edit, message = CASES[case]
    _write(squad_dir / "train-v1.1.json", edit)
    assert cli.main(train_args(squad_dir, tmp_path, "run")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "run").exists()


def test_a_whitespace_difference_is_not_a_misplaced_answer(tmp_path: Path) -> None:
    """SQuAD conversions differ from their contexts in whitespace only: a no-break space in
    the context, a space in the answer (the same length, so the offsets hold)."""
    context = "It was built by Robert\u00a0Stevenson in 1810."
    qa = {
        "id": "1",
        "question": "Who?",
        "answers": [{"text": "Robert Stevenson", "answer_start": 16}],
    }
    path = tmp_path / "f.json"
    path.write_text(json.dumps({"data": [{"paragraphs": [{"context": context, "qas": [qa]}]}]}))
    assert read_squad(path).questions[0].answers == ("Robert Stevenson",)


def test_json_nested_100000_deep(squad_dir: Path, tmp_path: Path, capsys) -> None:
    """Case 2: a RecursionError traceback before."""
    (squad_dir / "train-v1.1.json").write_text("[" * 100_000 + "]" * 100_000)
    assert cli.main(train_args(squad_dir, tmp_path, "run")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nested deeper" in err and "train-v1.1.json" in err
    assert not (tmp_path / "run").exists()


def test_untitled_articles_are_articles_of_their_own(tmp_path: Path) -> None:
    """Case 5: every title null made one article "None" of them all (no split possible, and
    with some titled, the untitled ones held out or trained on together)."""

    def untitled(document: dict[str, Any]) -> None:
        for article in document["data"]:
            article["title"] = None

    path = _write(tmp_path / "untitled.json", untitled)
    assert read_squad(path).articles() == ["article 0", "article 1", "article 2"]
    task = Reading(ReadingConfig(train_file=path, held_out_articles=0.34, min_char_count=1))
    squad = task.train.squad
    held = {squad.titles[squad.questions[i].paragraph] for i in task.held_index.tolist()}
    trained = {squad.titles[squad.questions[i].paragraph] for i in task.train_index.tolist()}
    assert len(held) == 1 and len(trained) == 2 and not held & trained


@pytest.mark.parametrize("option", ["--task.train-file", "--task.dev-file"])
def test_dev_null_as_a_data_file(squad_dir: Path, tmp_path: Path, capsys, option: str) -> None:
    """Case 6: /dev/null was "missing"."""
    files = {"--task.train-file": squad_dir / "train-v1.1.json", option: Path("/dev/null")}
    args = train_args(squad_dir, tmp_path, "run", "--task.train-file",
                      str(files["--task.train-file"]), "--task.dev-file",
                      str(files.get("--task.dev-file", squad_dir / "dev-v1.1.json")))  # fmt: skip
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"{option} /dev/null is a device, not a regular file" in err
    assert "pass a SQuAD-layout JSON file" in err
    assert not (tmp_path / "run").exists()


def test_a_folder_named_like_the_train_file(tmp_path: Path, capsys) -> None:
    """Case 6: a train-v1.1.json folder in --data-dir was passed over ("holds no ...")."""
    folder = tmp_path / "squad"
    (folder / "train-v1.1.json").mkdir(parents=True)
    assert cli.main(train_args(folder, tmp_path, "run")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"--data-dir {folder}: {folder / 'train-v1.1.json'} is a folder" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("number", ["nan", "inf", "-Infinity", "1e999"])
def test_non_finite_word_vectors(tmp_path: Path, number: str) -> None:
    """Case 7: NaN and infinities were taken as vectors."""
    glove = tmp_path / "glove.txt"
    glove.write_text(f"the 1 2 3\nbee 1 {number} 3\n")
    with pytest.raises(ValueError) as error:
        read_word_vectors(glove, Vocabulary(("the", "bee"), ()), 3)
    message = str(error.value)
    assert f"--task.embeddings {glove} line 2: the vector of 'bee' holds" in message
    assert "word vectors must be finite numbers" in message


def test_the_word_vector_cache_follows_the_content(tmp_path: Path) -> None:
    """Case 10, the prober's scenario: numbers edited, size kept, modification time restored."""
    glove = tmp_path / "glove.txt"
    glove.write_text("the 1 2 3\nbee 4 5 6\n")
    vocabulary = Vocabulary(("the", "bee"), ())
    assert read_word_vectors(glove, vocabulary, 3)[2].tolist() == [1, 2, 3]
    stat = glove.stat()
    glove.write_text("the 7 8 9\nbee 4 5 6\n")
    os.utime(glove, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert glove.stat().st_size == stat.st_size and glove.stat().st_mtime_ns == stat.st_mtime_ns
    assert read_word_vectors(glove, vocabulary, 3)[2].tolist() == [7, 8, 9]
    assert read_word_vectors(glove, vocabulary, 3)[2].tolist() == [7, 8, 9]  # its own cache


def test_word_vectors_from_a_fifo_are_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "glove.txt"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match=r"--task.embeddings .* is a FIFO"):
        read_word_vectors(fifo, Vocabulary(("the",), ()), 3)


def test_a_killed_writers_temporary_file_is_removed(tmp_path: Path) -> None:
    """Case 11: a kill during a cache write left ``.NAME.PID.tmp`` behind for ever."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    dead = int(child.stdout)  # a process that has ended
    cache = tmp_path / CACHE_DIR
    cache.mkdir()
    orphan = cache / f".train-v1.1.json.abc.tokens.safetensors.{dead}.tmp"
    orphan.write_bytes(b"half a file")
    alive = cache / f".other.json.vocab.json.{os.getppid()}.tmp"  # a writer still running
    alive.write_bytes(b"being written")
    write_cache(cache / "new.json", lambda tmp: tmp.write_text("{}"), None)
    assert not orphan.exists() and alive.exists()
    assert sorted(p.name for p in cache.iterdir()) == sorted([alive.name, "new.json"])


class _SlowReader(torch.nn.Module):
    """Span logits that favour the first token, after ``seconds`` of "reading"."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def forward(self, inputs, state, lengths):
        time.sleep(self.seconds)
        logits = torch.zeros(inputs.shape[0], 1 + inputs.shape[1] - 40, 2)
        logits[:, 0] = float("-inf")
        logits[:, 1] = 1.0
        return logits, None


def _reader(seconds: float = 0.0) -> AnswerReader:
    return AnswerReader(Vocabulary(("karl",), ("a",)), ReadingConfig(), _SlowReader(seconds))


@pytest.mark.parametrize(
    ("context", "question", "message"),
    [
        ("", "Who?", "the context is empty"),
        (" \n", "Who?", "the context is empty"),
        ("Karl \udcff decoded it.", "Who?", "the context holds '\\udcff' at character 5"),
        ("Karl decoded it.", "Wh\udce9o?", "question 1 holds '\\udce9' at character 2"),
        ("Karl decoded it.", " ", "question 1 is empty"),
    ],
)
def test_the_reader_refuses_empty_and_undecodable_text(context, question, message) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("\\", "\\\\")):
        _reader()(context, question)


def test_a_slow_read_shows_a_progress_bar(monkeypatch, capsys) -> None:
    """Case 12: a long context read for minutes showed nothing (here: 2 s made 0.05 s)."""
    monkeypatch.setattr(answer_module, "PROGRESS_AFTER_S", 0.05)
    monkeypatch.setattr(answer_module, "PROGRESS_EVERY_S", 0.05)
    result = _reader(0.3)("Karl decoded the dance.", "Who?", progress=True)
    assert result.text == "Karl"
    assert "reading 5 tokens" in capsys.readouterr().err
    _reader(0.0)("Karl decoded the dance.", "Who?", progress=True)  # quick: no bar
    assert capsys.readouterr().err == ""


def test_ticking_redraws_a_bar_that_nothing_updates() -> None:
    out = io.StringIO()
    bar = tqdm(total=1, desc="long", file=out, delay=10)
    with ticking(bar, after=0.0, every=0.01):
        time.sleep(0.1)
    bar.close()
    assert out.getvalue().count("long") >= 2


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> tuple[Path, Path]:
    """A v1.1 run of the sample (trained once for this module) and its data folder."""
    root = tmp_path_factory.mktemp("run")
    folder = root / "squad"
    folder.mkdir()
    for name in ("train-v1.1.json", "dev-v1.1.json"):
        folder.joinpath(name).write_bytes(SAMPLE.read_bytes())
    folder.joinpath("sample-v2.0.json").write_bytes(
        SAMPLE.with_name("sample-v2.0.json").read_bytes()
    )
    assert cli.main(train_args(folder, root, "run", "--steps", "1")) == 0
    return root / "run", folder


def test_eval_of_a_v1_run_on_v2_data(trained_run, tmp_path: Path, capsys) -> None:
    """Case 8: a v1.1 run cannot say "no answer"; it scored 0 on every unanswerable question."""
    run, folder = trained_run
    capsys.readouterr()
    out = tmp_path / "eval.json"
    data = folder / "sample-v2.0.json"
    assert cli.main(["eval", str(run), "--data", str(data), "--json-out", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("relmem: squad: "), lines  # the run's data
    err = lines[1]
    assert err.startswith("relmem eval: error: ")
    assert f"{data}: 6 of its 24 questions are unanswerable" in err
    assert 'no "no answer" output' in err and "train on data with unanswerable questions" in err
    assert not out.exists() and not out.with_name("predictions.json").exists()


def test_eval_on_a_data_file_with_a_lone_surrogate(trained_run, tmp_path: Path, capsys) -> None:
    """Case 4, through ``relmem eval --data``: the same check as training's."""
    run, _ = trained_run
    edit, message = CASES["surrogate in a question"]
    data = _write(tmp_path / "dev.json", edit)
    capsys.readouterr()
    out = tmp_path / "eval.json"
    assert cli.main(["eval", str(run), "--data", str(data), "--json-out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("relmem eval: error: ") and str(data) in err and message in err
    assert not out.exists()


@pytest.mark.parametrize("data", ["/dev/null", "folder"])
def test_eval_on_a_data_file_that_is_not_a_file(trained_run, tmp_path: Path, capsys, data) -> None:
    """Case 6, through ``relmem eval --data``: the option is named as the user gave it."""
    run, _ = trained_run
    path = Path(data) if data.startswith("/") else tmp_path
    capsys.readouterr()
    out = tmp_path / "eval.json"
    assert cli.main(["eval", str(run), "--data", str(path), "--json-out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"relmem eval: error: --data {path} is a "), err
    assert "pass a squad data file" in err and not out.exists()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: "", "--context is empty"),
        (lambda d: " ", "--context is empty"),
        (lambda d: str(d / "empty.txt"), "empty.txt: the file holds no text"),
        (lambda d: "/dev/null", "--context /dev/null is a device, not a regular file"),
        (lambda d: "Karl decoded \udcff the dance", "--context holds '\\udcff' at character 13"),
    ],
)  # fmt: skip
def test_answer_refuses_an_empty_or_undecodable_context(trained_run, capsys, make, message):
    """Case 9 and 4: an empty --context was "a folder" (Path('') is '.'); bytes that are not
    UTF-8 on the command line arrive as lone surrogates."""
    run, folder = trained_run
    (folder / "empty.txt").write_text("\n")
    capsys.readouterr()
    assert cli.main(["answer", str(run), "--context", make(folder), "--question", "Who?"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert message in captured.err, captured.err


def test_answer_names_the_undecodable_or_empty_question(trained_run, capsys) -> None:
    run, _ = trained_run
    capsys.readouterr()
    undecodable = b"Who \xe9?".decode("utf-8", "surrogateescape")  # as argv gives it
    args = ["answer", str(run), "--context", "Karl decoded it.", "--question", "Who?"]
    args += ["--question", undecodable]
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "--question (the 2nd) holds '\\udce9' at character 4" in err and "UTF-8" in err
    assert cli.main(["answer", str(run), "--context", "Karl decoded it.", "--question", " "]) == 2
    empty = "relmem answer: error: --question is empty: ask a question"
    assert capsys.readouterr().err.strip() == empty


def test_reading_config_options_carry_every_size() -> None:
    """Case 13: the reader's sizes come from ReadingConfig.options()."""
    config = ReadingConfig(word_size=12, hidden_size=6, dropout=0.1, max_answer_tokens=5)
    options = config.options(Vocabulary(("a", "b"), ("c",)), no_answer=True)
    assert (options.vocab_size, options.char_vocab_size) == (4, 3)
    assert (options.word_size, options.hidden_size, options.dropout) == (12, 6, 0.1)
    assert options.max_answer_tokens == 5 and options.no_answer and not options.freeze_words
    assert options.question_block == config.question_tokens and options.chars == config.chars


def test_resolve_names_the_data_dir_for_a_device_train_file(tmp_path: Path) -> None:
    folder = tmp_path / "squad"
    folder.mkdir()
    os.symlink("/dev/null", folder / "train-v1.1.json")
    with pytest.raises(ValueError) as error:
        sources.resolve(ReadingConfig(data_dir=folder, held_out_articles=0.5))
    message = str(error.value)
    assert message.startswith(f"--data-dir {folder}: {folder / 'train-v1.1.json'} (a link to")
    assert "is a device, not a regular file" in message
