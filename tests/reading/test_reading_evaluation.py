"""Evaluation by length: rows read in chunks of similar lengths, never padded all at once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from reading_sample import train_args

from relmem import cli
from relmem.models.reader import Reader
from relmem.tasks.base import LazyRows, row_chunks
from relmem.train.evaluation import evaluate
from relmem.train.runs import load_trained


def test_row_chunks_cap_rows_and_padded_tokens() -> None:
    lengths = torch.tensor([3, 3, 4, 10, 10, 50, 2])
    rows = torch.arange(6)  # sorted by length, as a held-out set is
    chunks = row_chunks(rows, lengths, max_rows=4, max_tokens=20)
    assert [c.tolist() for c in chunks] == [[0, 1, 2], [3, 4], [5]]
    for chunk in chunks[:-1]:
        assert len(chunk) * int(lengths[chunk].max()) <= 20 or len(chunk) == 1
    assert torch.cat(chunks).tolist() == rows.tolist()
    assert [c.tolist() for c in row_chunks(rows, None, max_rows=4)] == [[0, 1, 2, 3], [4, 5]]
    assert row_chunks(torch.arange(0), lengths, 4) == []


@pytest.fixture
def reader(squad_dir: Path, tmp_path: Path):
    assert cli.main(train_args(squad_dir, tmp_path, "run", "--steps", "1")) == 0
    _, _, task, model, _ = load_trained(tmp_path / "run", None, torch.device("cpu"))
    return task, model


def test_the_reader_evaluates_chunk_by_chunk_as_in_one_pass(reader) -> None:
    task, model = reader
    held = task.held_out(torch.device("cpu"))
    assert isinstance(held, LazyRows)
    built: list[int] = []
    select = held.select

    def counting(rows):
        batch = select(rows)
        built.append(batch.inputs.shape[0] * batch.inputs.shape[1])
        return batch

    held.select = counting  # type: ignore[method-assign]
    whole = held.select(torch.arange(held.size))
    one_pass = evaluate(model, task, whole, chunk=held.size)
    built.clear()
    chunked = evaluate(model, task, held, chunk=2)
    assert len(built) >= held.size // 2 and max(built) < whole.inputs.numel() // 4
    for key in ("loss", "f1", "exact_match"):
        assert chunked[key] == pytest.approx(one_pass[key], rel=1e-6, abs=1e-9)
    assert chunked["groups"] == pytest.approx(one_pass["groups"])
    in_chunks = evaluate(model, task, held, chunk=3, predictions=True)["predictions"]
    assert in_chunks == evaluate(model, task, whole, chunk=10**6, predictions=True)["predictions"]
    assert len(in_chunks) == held.size and all(isinstance(v, str) for v in in_chunks.values())


def test_eval_reads_each_held_out_question_once(squad_dir: Path, tmp_path: Path, monkeypatch):
    """The metrics and the predictions file come from one forward pass over the rows."""
    assert cli.main(train_args(squad_dir, tmp_path, "run", "--steps", "1")) == 0
    rows: list[int] = []
    forward = Reader.forward

    def counting(self, inputs, *args, **kwargs):
        rows.append(inputs.shape[0])
        return forward(self, inputs, *args, **kwargs)

    monkeypatch.setattr(Reader, "forward", counting)
    assert cli.main(["eval", str(tmp_path / "run")]) == 0
    predictions = json.loads((tmp_path / "run" / "eval-predictions-held-out.json").read_text())
    assert sum(rows) == len(predictions) == 18  # the sample's questions
