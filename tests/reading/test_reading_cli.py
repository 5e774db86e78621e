"""``relmem train squad``, ``eval``, ``answer`` end to end on the sample."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from reading_sample import train_args
from safetensors.torch import load_file

from relmem import cli
from relmem.tasks.reading import answer
from relmem.train import checkpoint as ckpt_io
from relmem.train.runs import load_trained


@pytest.mark.parametrize("model", ["dnc", "none", "rmc"])
def test_train_eval_and_answer(squad_dir: Path, tmp_path: Path, capsys, model: str) -> None:
    assert cli.main(train_args(squad_dir, tmp_path, model, "--model", model)) == 0
    run = tmp_path / model
    data = json.loads((run / "data.json").read_text())
    assert data["vocabulary"]["tokenizer"] == "tokenizers.BertPreTokenizer"
    capsys.readouterr()
    assert cli.main(["eval", str(run)]) == 0
    out = capsys.readouterr().out
    assert "official scores" in out and "0-99 tokens" in out
    predictions = json.loads((run / "eval-predictions-held-out.json").read_text())
    ids = {q["id"] for a in json.loads((squad_dir / "dev-v1.1.json").read_text())["data"]
           for p in a["paragraphs"] for q in p["qas"]}  # fmt: skip
    assert set(predictions) == ids and all(isinstance(v, str) for v in predictions.values())
    record = json.loads((run / "eval.json").read_text())
    assert record["official"]["all"]["total"] == len(ids)
    assert record["predictions"] == "eval-predictions-held-out.json"
    # the official F1 of the predictions file equals the trainer's held-out F1
    assert record["official"]["all"]["f1"] == pytest.approx(100 * record["f1"])
    context = squad_dir / "notes.txt"
    context.write_text("Karl von Frisch decoded the dance.\nHe shared the 1973 prize.")
    questions = ["--question", "Who decoded the dance?", "--question", "When?"]
    assert cli.main(["answer", str(run), "--context", str(context), *questions]) == 0
    out = capsys.readouterr().out
    assert out.count("Q: ") == 2 and "[[" in out
    result = answer(run, context.read_text(), "Who decoded the dance?")
    assert context.read_text()[result.start : result.end] == result.text and result.text
    assert 0 < result.probability <= 1


def test_a_reader_overfits_the_sample(squad_dir: Path, tmp_path: Path, capsys) -> None:
    """Trained on the sample's 18 questions, the reader answers them (F1 near 100)."""
    args = train_args(squad_dir, tmp_path, "fit", "--model", "none", "--steps", "150",
                      "--eval-every", "150", "--optim.lr", "1e-2", "--task.dropout", "0",
                      "--batch-size", "18")  # fmt: skip
    assert cli.main(args) == 0
    summary = json.loads((tmp_path / "fit" / "summary.json").read_text())
    assert summary["held_out_f1"] > 0.95, summary


def test_recomputed_memory_trains_as_the_whole_one(squad_dir: Path, tmp_path: Path) -> None:
    """``--dnc.recompute-steps`` trains the reader's memory in checkpointed chunks: the same
    training and held-out losses at every logged step, to float32 rounding (the chunks' weight
    gradients are summed in another order)."""
    assert cli.main(train_args(squad_dir, tmp_path, "whole")) == 0
    assert cli.main(train_args(squad_dir, tmp_path, "chunks", "--dnc.recompute-steps", "5")) == 0
    config, *_, chunked, _ = load_trained(tmp_path / "chunks")
    assert config.dnc.recompute_steps == 5
    assert chunked.memory[0].layer.recompute_steps == 5  # type: ignore[index, union-attr]

    def losses(name: str) -> list[float]:
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        return [row[k] for row in map(json.loads, lines) for k in ("train/loss", "eval/loss")]

    whole = losses("whole")
    assert len(whole) == 4 and losses("chunks") == pytest.approx(whole, rel=1e-5)


def test_resumed_run_equals_an_uninterrupted_one(squad_dir: Path, tmp_path: Path) -> None:
    assert cli.main(train_args(squad_dir, tmp_path, "straight")) == 0
    assert cli.main(train_args(squad_dir, tmp_path, "split", "--steps", "2")) == 0
    assert cli.main(["train", "squad", "--resume", str(tmp_path / "split"), "--steps", "4"]) == 0
    weights = [
        load_file(ckpt_io.resolve_checkpoint(tmp_path / name) / ckpt_io.MODEL_FILE)
        for name in ("straight", "split")
    ]
    for key in weights[0]:
        assert torch.equal(weights[0][key], weights[1][key]), key
    summaries = [
        json.loads((tmp_path / n / "summary.json").read_text()) for n in ("straight", "split")
    ]
    assert summaries[0]["best_held_out_f1"] == summaries[1]["best_held_out_f1"]


def test_padding_changes_nothing(squad_dir: Path, tmp_path: Path) -> None:
    """A question's logits alone equal its logits batched beside a longer context (more
    padding), for the memory controller, no memory and the RMC."""
    for model in ("dnc", "none", "rmc"):
        assert (
            cli.main(train_args(squad_dir, tmp_path, model, "--model", model, "--steps", "1")) == 0
        )
        _, _, task, net, _ = load_trained(tmp_path / model, None, torch.device("cpu"))
        net.eval()
        batch = task.held_out(torch.device("cpu"))
        short = batch.select(torch.tensor([0]))  # the shortest context
        both = batch.select(torch.tensor([0, batch.size - 1]))
        assert both.inputs.shape[1] > short.inputs.shape[1]
        with torch.no_grad():
            alone, _ = net(short.inputs, None, lengths=short.lengths)
            beside, _ = net(both.inputs, None, lengths=both.lengths)
        steps = alone.shape[1]
        torch.testing.assert_close(beside[0, :steps], alone[0], rtol=1e-5, atol=1e-5)
        assert torch.isinf(beside[0, steps:]).all()


def test_v2_questions_train_and_score_no_answer(squad_dir: Path, tmp_path: Path, capsys) -> None:
    args = train_args(squad_dir, tmp_path, "v2", "--task.train-file",
                      str(squad_dir / "sample-v2.0.json"), "--task.dev-file",
                      str(squad_dir / "sample-v2.0.json"))  # fmt: skip
    assert cli.main(args) == 0
    capsys.readouterr()
    assert cli.main(["eval", str(tmp_path / "v2")]) == 0
    out = capsys.readouterr().out
    assert "HasAns" in out and "NoAns" in out
    record = json.loads((tmp_path / "v2" / "eval.json").read_text())
    assert record["official"]["all"]["NoAns_total"] == 6


def test_eval_on_another_file_and_a_changed_vocabulary(squad_dir: Path, tmp_path: Path, capsys):
    assert cli.main(train_args(squad_dir, tmp_path, "run", "--steps", "2")) == 0
    capsys.readouterr()
    other = squad_dir / "other.json"
    other.write_text((squad_dir / "dev-v1.1.json").read_text().replace("Arbroath", "Montrose"))
    assert cli.main(["eval", str(tmp_path / "run"), "--data", str(other)]) == 0
    assert "official scores" in capsys.readouterr().out
    # a v1.1 run has no "no answer" output: v2.0 data is refused (test_reading_bad_input.py)
    v2 = squad_dir / "sample-v2.0.json"
    assert cli.main(["eval", str(tmp_path / "run"), "--data", str(v2)]) == 2
    assert "unanswerable" in capsys.readouterr().err
    train = squad_dir / "train-v1.1.json"
    train.write_text(train.read_text().replace("Arbroath", "Montrose"))
    assert cli.main(["eval", str(tmp_path / "run")]) == 2
    assert "the data differs" in capsys.readouterr().err
    assert cli.main(["answer", str(tmp_path / "run"), "--context", "x y", "--question", "q"]) == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"[1, 2]", "the top level: expected a JSON object"),
        (b'{"data": [{"paragraphs": [{"context": "abc", "qas": [{"question": "q"}]}]}]}',
         "data[0].paragraphs[0].qas[0]: has no 'id'"),
        (b'{"data": [{"paragraphs": [{"context": "", "qas": []}]}]}',
         "data[0].paragraphs[0].context: is empty"),
        ('{"data": "\xe9"}'.encode("latin-1"), "not UTF-8"),
    ],
)  # fmt: skip
def test_bad_files_stop_training_with_one_line(tmp_path: Path, capsys, content, message) -> None:
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    args = ["train", "squad", "--task.train-file", str(bad), "--task.held-out-articles", "0.5",
            "--out-dir", str(tmp_path / "runs")]  # fmt: skip
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(bad) in err and message in err, err
    assert not (tmp_path / "runs").exists()


def test_bad_options_and_missing_files(squad_dir: Path, tmp_path: Path, capsys) -> None:
    runs = ["--out-dir", str(tmp_path / "runs")]
    cases = [
        (["--data-dir", str(squad_dir / "dev-v1.1.json")], "is a file, not a folder"),
        (["--data-dir", str(tmp_path / "nowhere")], "is missing"),
        (["--task.train-file", str(squad_dir / "train-v1.1.json")], "no evaluation file"),
        ([], "no data given"),
    ]
    for extra, message in cases:
        assert cli.main(["train", "squad", *extra, *runs]) == 2
        assert message in capsys.readouterr().err
    glove = tmp_path / "glove.txt"
    glove.write_text("the 1 2 3\n")
    args = train_args(squad_dir, tmp_path, "glove", "--task.embeddings", str(glove))
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "line 1: 3 numbers after the word, expected 16" in err and str(glove) in err
    assert not (tmp_path / "glove").exists()
    assert cli.main(train_args(squad_dir, tmp_path, "run", "--steps", "1")) == 0
    capsys.readouterr()
    missing = str(tmp_path / "missing.txt")
    assert cli.main(["answer", str(tmp_path / "run"), "--context", missing, "-q", "q"]) != 0
    assert cli.main(["answer", str(tmp_path / "run"), "--context", missing,
                     "--question", "q"]) == 2  # fmt: skip
    assert f"--context {missing}: no such file" in capsys.readouterr().err
