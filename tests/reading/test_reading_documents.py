"""``relmem eval RUN --document article``: each held-out question answered from its whole
article (its paragraphs ranked, the best read), beside the paragraph-level figures."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from reading_sample import train_args

from relmem import cli
from relmem.tasks.reading.documents import read_articles, read_held_out_articles
from relmem.tasks.reading.ranking import DEFAULT_RANKER, RANKER_WEIGHT
from relmem.tasks.reading.squad import Question, SquadFile
from relmem.tasks.reading.task import ReadingConfig
from relmem.train.runs import load_trained


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A tiny reader trained on the sample (3 articles of 2 paragraphs)."""
    root = tmp_path_factory.mktemp("documents")
    folder = root / "squad"
    folder.mkdir()
    sample = Path(__file__).resolve().parents[1] / "data" / "squad" / "sample-v1.1.json"
    for name in ("train-v1.1.json", "dev-v1.1.json"):
        (folder / name).write_bytes(sample.read_bytes())
    assert cli.main(train_args(folder, root, "run", "--steps", "2")) == 0
    return root / "run"


class Reader:
    """A stand-in reader: answers each question with the first paragraph it was handed."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.config = ReadingConfig()  # its ranker ranks the paragraphs for the recall

    def __call__(self, text, questions, *, paragraphs):
        self.texts.append(text)
        return [type("A", (), {"text": text.split("\n\n")[0]})() for _ in questions]


def test_each_question_reads_its_own_articles_paragraphs_only() -> None:
    contexts = ["Alpha one lamp.", "Alpha two keeper.", "Beta three tower.", "Beta four stone."]
    squad = SquadFile(
        Path("x.json"),
        contexts,
        ["Alpha", "Alpha", "Beta", "Beta"],
        [
            Question("q1", "which keeper?", 1, ("keeper",), (10,)),
            Question("q2", "which stone?", 3, ("stone",), (11,)),
            Question("q3", "which tower?", 2, ("tower",), (11,)),
        ],
    )
    reader = Reader()
    found = read_articles(reader, squad, [0, 1, 2], paragraphs=1)  # type: ignore[arg-type]
    assert reader.texts == ["\n\n".join(contexts[:2]), "\n\n".join(contexts[2:])]
    assert found.articles == 2 and found.paragraphs == 1
    assert found.predictions == {"q1": contexts[0], "q2": contexts[2], "q3": contexts[2]}
    assert found.recall == 1.0  # each question's own paragraph ranks first (its rare word)
    assert read_articles(reader, squad, [0], paragraphs=0).recall == 1.0  # type: ignore[arg-type]


def test_every_held_out_question_is_answered_from_its_article(
    run: Path,
) -> None:
    """With all of an article's paragraphs read, its own among them, every prediction is a span
    of the article."""
    _, _, task, model, _ = load_trained(run, None, torch.device("cpu"))
    reading, official = read_held_out_articles(task, model, paragraphs=0)
    squad = task.held.squad
    assert set(reading.predictions) == {q.qid for q in squad.questions}
    for question in squad.questions:
        title = squad.titles[question.paragraph]
        pairs = zip(squad.contexts, squad.titles, strict=True)
        article = "\n\n".join(c for c, t in pairs if t == title)
        assert reading.predictions[question.qid] in article
    assert reading.recall == 1.0 and official["all"]["total"] == len(squad.questions)
    assert 0 <= official["all"]["f1"] <= 100


def test_eval_reports_the_article_level_beside_the_paragraph_level(
    run: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "eval.json"
    capsys.readouterr()
    argv = ["eval", str(run), "--document", "article", "--paragraphs", "1", "--json-out", str(out)]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "article-level: each question answered from the 1 best" in printed
    record = json.loads(out.read_text())
    article = record["article"]
    assert article["paragraphs"] == 1 and 0 <= article["ranker_recall"] <= 1
    assert not math.isnan(article["official"]["all"]["f1"])
    assert article["predictions"] == "eval-predictions-held-out-article.json"
    assert record["ranker_weight"] == RANKER_WEIGHT  # the run's own, the default
    assert record["ranker"] == DEFAULT_RANKER
    assert cli.main([*argv, "--ranker-weight", "0", "--ranker", "bm25"]) == 0
    again = json.loads(out.read_text())
    assert again["ranker_weight"] == 0 and again["ranker"] == "bm25"
    assert "(bm25 ranked;" in capsys.readouterr().out
    written = json.loads((tmp_path / article["predictions"]).read_text())
    assert set(written) == set(json.loads((tmp_path / record["predictions"]).read_text()))


def test_a_run_written_before_the_ranker_existed_reads_with_bm25(run: Path, tmp_path: Path) -> None:
    old = tmp_path / "old-run"
    shutil.copytree(run, old)
    config = json.loads((old / "config.json").read_text())
    assert config["task"].pop("ranker") == DEFAULT_RANKER  # what a run records now
    (old / "config.json").write_text(json.dumps(config))
    out = tmp_path / "eval.json"
    argv = ["eval", str(old), "--document", "article", "--json-out", str(out)]
    assert cli.main(argv) == 0
    assert json.loads(out.read_text())["ranker"] == "bm25"
    assert cli.main([*argv, "--ranker", "bm25-proximity"]) == 0
    assert json.loads(out.read_text())["ranker"] == "bm25-proximity"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--document", "article", "--paragraphs", "-1"], "--paragraphs -1: read at least 1"),
        (["--document", "chapter"], "chapter"),
        (["--ranker-weight", "nan"], "--ranker-weight must be a finite number >= 0"),
        (["--ranker", "tfidf"], "tfidf"),
    ],
)
def test_bad_document_options_are_refused(run: Path, tmp_path: Path, capsys, options, message):
    out = tmp_path / "eval.json"
    capsys.readouterr()
    assert cli.main(["eval", str(run), *options, "--json-out", str(out)]) == 2
    assert message in capsys.readouterr().err and not out.exists()


def test_document_article_on_a_task_without_documents(tmp_path: Path, capsys) -> None:
    argv = ["train", "nth-farthest", "--device", "cpu", "--cpu-threads", "1", "--steps", "1",
            "--batch-size", "4", "--eval-every", "1", "--checkpoint-every", "1",
            "--eval-batch", "4", "--task.test-size", "4", "--rmc.mem-slots", "2",
            "--rmc.head-size", "4", "--rmc.num-heads", "1", "--out-dir", str(tmp_path),
            "--run-name", "nth", "--no-tensorboard"]  # fmt: skip
    assert cli.main(argv) == 0
    capsys.readouterr()
    out = tmp_path / "eval.json"
    argv = ["eval", str(tmp_path / "nth"), "--document", "article", "--json-out", str(out)]
    assert cli.main(argv) == 2
    assert "--document article: nth-farthest runs read no documents" in capsys.readouterr().err
    argv = ["eval", str(tmp_path / "nth"), "--ranker-weight", "0.5", "--json-out", str(out)]
    assert cli.main(argv) == 2
    error = capsys.readouterr().err
    assert "--ranker-weight: nth-farthest runs choose among no paragraphs" in error
    argv = ["eval", str(tmp_path / "nth"), "--ranker", "bm25", "--json-out", str(out)]
    assert cli.main(argv) == 2
    assert "--ranker: nth-farthest runs rank no paragraphs" in capsys.readouterr().err
    assert not out.exists()
