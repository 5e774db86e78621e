"""``relmem train lm``, ``relmem eval`` and ``relmem generate`` end to end on the test sample,
in one process and as two data-parallel processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lm_sample import write_sample
from safetensors.torch import load_file

from relmem import cli
from relmem.train import checkpoint as ckpt_io

SRC = str(Path(__file__).resolve().parents[2] / "src")


def train_args(data: Path, out: Path, name: str, *extra: str, device: str = "cpu") -> list[str]:
    return [
        "train",
        "lm",
        "--data-dir",
        str(data),
        "--device",
        device,
        "--steps",
        "6",
        "--batch-size",
        "4",
        "--eval-batch",
        "4",
        "--eval-every",
        "3",
        "--log-every",
        "3",
        "--checkpoint-every",
        "3",
        "--task.bptt",
        "5",
        "--task.eval-rows",
        "2",
        "--task.embedding-size",
        "8",
        "--task.cutoffs",
        "20",
        "40",
        "--task.div-value",
        "2",
        "--rmc.head-size",
        "4",
        "--lstm.hidden-size",
        "8",
        "--out-dir",
        str(out),
        "--run-name",
        name,
        *extra,
    ]


@pytest.mark.parametrize("model", ["rmc", "lstm"])
def test_train_eval_generate(model: str, tmp_path: Path, capsys, device: torch.device) -> None:
    data = write_sample(tmp_path / "data", "txt")
    assert cli.main(train_args(data, tmp_path, model, "--model", model, device=device.type)) == 0
    out = capsys.readouterr().out
    assert f"parameters) on {device.type}" in out
    run_dir = tmp_path / model
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["metric"] == "perplexity" and summary["held_out_perplexity"] > 1
    assert summary["best_held_out_perplexity"] <= summary["held_out_perplexity"]
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("train/perplexity" in r and "perf/tokens_per_s" in r for r in lines)
    # no best-batch figure: a corpus has no fresh batches (it scored a training window)
    assert not any("eval/batch_perplexity" in r for r in lines)
    assert summary["best_batch_perplexity"] is None
    best = ckpt_io.best_checkpoint(run_dir)
    assert best is not None

    assert cli.main(["eval", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert f"checkpoint {best}" in out and "held-out perplexity" in out and "test perplexity" in out
    record = json.loads((run_dir / "eval.json").read_text())
    assert record["perplexity"] == pytest.approx(summary["best_held_out_perplexity"], rel=1e-6)
    assert record["more_held_out"]["test"]["perplexity"] > 1

    args = ["generate", str(run_dir), "--prompt", "The lamps", "--tokens", "8", "--seed", "5"]
    assert cli.main([*args, "--top-p", "0.9"]) == 0
    first = capsys.readouterr().out
    assert cli.main([*args, "--top-p", "0.9"]) == 0
    assert capsys.readouterr().out == first and first.startswith("The lamps ")
    assert len(first.split()) >= 3


def test_resumed_run_equals_an_uninterrupted_one(tmp_path: Path, capsys) -> None:
    """3 steps, resume, 3 more == 6 steps: weights, carried state and best perplexity."""
    data = write_sample(tmp_path / "data")
    assert cli.main(train_args(data, tmp_path, "straight")) == 0
    assert cli.main(train_args(data, tmp_path, "split", "--steps", "3")) == 0
    assert cli.main(["train", "lm", "--resume", str(tmp_path / "split"), "--steps", "6"]) == 0
    capsys.readouterr()
    weights = [
        load_file(ckpt_io.resolve_checkpoint(tmp_path / name) / ckpt_io.MODEL_FILE)
        for name in ("straight", "split")
    ]
    for key in weights[0]:
        assert torch.equal(weights[0][key], weights[1][key]), key
    summaries = [
        json.loads((tmp_path / n / "summary.json").read_text()) for n in ("straight", "split")
    ]
    assert summaries[0]["best_held_out_perplexity"] == summaries[1]["best_held_out_perplexity"]
    assert summaries[1]["best_checkpoint"] == str(tmp_path / "split" / "checkpoints" / "best")


def test_generate_and_resume_errors(tmp_path: Path, capsys) -> None:
    data = write_sample(tmp_path / "data")
    assert cli.main(train_args(data, tmp_path, "run", "--steps", "3")) == 0
    capsys.readouterr()
    run_dir = str(tmp_path / "run")
    assert cli.main(["generate", run_dir, "--top-k", "3", "--top-p", "0.5"]) == 2
    assert "--top-k and --top-p exclude each other" in capsys.readouterr().err
    assert cli.main(["generate", run_dir, "--temperature", "-1"]) == 2
    assert "--temperature must be a finite number >= 0" in capsys.readouterr().err
    assert cli.main(["generate", run_dir, "--temperature", "inf"]) == 2
    assert "--temperature must be a finite number >= 0" in capsys.readouterr().err
    best = str(ckpt_io.best_checkpoint(Path(run_dir)))
    assert cli.main(["train", "lm", "--resume", best, "--steps", "6"]) == 2
    assert "holds weights only" in capsys.readouterr().err


def test_a_changed_vocabulary_is_refused_by_eval_generate_and_resume(
    tmp_path: Path, capsys
) -> None:
    """A line moved to the front of train.txt keeps the vocabulary's size and moves its ids:
    the weights loaded silently and read other words (validation perplexity 1.3 -> 462)."""
    data = write_sample(tmp_path / "data", "txt")
    assert cli.main(train_args(data, tmp_path, "run", "--steps", "3")) == 0
    run_dir = tmp_path / "run"
    recorded = json.loads((run_dir / "data.json").read_text())["vocabulary"]
    assert recorded["tokenization"] == "word" and recorded["size"] > 10
    train = data / "train.txt"
    lines = train.read_text(encoding="utf-8").splitlines(keepends=True)
    train.write_text(lines[-2] + "".join(lines), encoding="utf-8")  # the same words, reordered
    capsys.readouterr()
    for command in (
        ["eval", str(run_dir)],
        ["generate", str(run_dir), "--prompt", "The lamps"],
        ["train", "lm", "--resume", str(run_dir), "--steps", "6"],
    ):
        assert cli.main(command) == 2, command
        err = capsys.readouterr().err
        assert f"the data differs from what {run_dir} trained on" in err, command
        assert '"size": ' + str(recorded["size"]) in err and "restore the data" in err
    train.write_text("".join(lines), encoding="utf-8")  # restored: accepted again
    assert cli.main(["eval", str(run_dir)]) == 0


def test_a_missing_data_json_is_named_by_eval(tmp_path: Path, capsys) -> None:
    """Without ``data.json`` the vocabulary check is skipped: eval says so (it said nothing,
    and a reordered corpus evaluated with moved ids)."""
    data = write_sample(tmp_path / "data", "txt")
    assert cli.main(train_args(data, tmp_path, "run", "--steps", "3")) == 0
    run_dir = tmp_path / "run"
    (run_dir / "data.json").unlink()
    capsys.readouterr()
    assert cli.main(["eval", str(run_dir)]) == 0
    err = capsys.readouterr().err
    assert f"{run_dir / 'data.json'} is missing, so the data cannot be checked" in err


def test_a_data_dir_that_is_a_file_is_named_so(tmp_path: Path, capsys) -> None:
    """It said the directory did not exist."""
    data = write_sample(tmp_path / "data", "txt")
    assert cli.main(train_args(data / "train.txt", tmp_path, "run")) == 2
    err = capsys.readouterr().err
    assert f"data directory {data / 'train.txt'} is a file, not a directory" in err
    assert not (tmp_path / "run").exists()


def test_missing_split_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    data = write_sample(tmp_path / "data", "txt")
    (data / "valid.txt").unlink()
    assert cli.main(train_args(data, tmp_path, "x")) == 2
    err = capsys.readouterr().err
    assert err.startswith("relmem train: error: ") and "but not valid.txt" in err
    assert len(err.strip().splitlines()) == 1


def test_a_split_too_short_for_its_rows_names_the_option_and_writes_nothing(
    tmp_path: Path, capsys
) -> None:
    """A tiny validation split said 'use a smaller batch' (the rows are --task.eval-rows) and
    left a run directory behind (the held-out set was built after the logs were opened)."""
    data = write_sample(tmp_path / "data", "txt")
    (data / "valid.txt").write_text("a b\n", encoding="utf-8")
    assert cli.main(train_args(data, tmp_path, "x")) == 2
    err = capsys.readouterr().err
    assert "the valid split has 3 tokens" in err and "lower --task.eval-rows" in err
    assert not (tmp_path / "x").exists()


def test_two_processes_train_on_their_own_slices(tmp_path: Path) -> None:
    """torchrun with 2 gloo processes (adaptive softmax, carried state) finishes, and its
    weights equal one process's with the same global batch."""
    data = write_sample(tmp_path / "data")
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node"]
    for name, procs in (("single", 1), ("ddp", 2)):
        no_dropout = ["--task.embedding-dropout", "0", "--task.output-dropout", "0"]
        args = train_args(data, tmp_path, name, "--model", "lstm", "--deterministic", *no_dropout)
        result = subprocess.run(
            [*launch, str(procs), "-m", "relmem", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stdout + result.stderr
    single = load_file(ckpt_io.resolve_checkpoint(tmp_path / "single") / ckpt_io.MODEL_FILE)
    ddp = load_file(ckpt_io.resolve_checkpoint(tmp_path / "ddp") / ckpt_io.MODEL_FILE)
    for key in single:
        torch.testing.assert_close(ddp[key], single[key], rtol=1e-4, atol=1e-6, msg=key)


def test_an_evaluation_off_the_grid_does_not_compete_for_best(tmp_path: Path, capsys) -> None:
    """A run that stops off its evaluation grid (here at 7, evaluating every 3) logs a `stop`
    evaluation that feeds nothing: it copied its weights to checkpoints/best, which the
    uninterrupted run resumed from there never had (docs/runs.md §1)."""
    data = write_sample(tmp_path / "data")
    argv = train_args(data, tmp_path, "run", "--steps", "7", "--task.embedding-dropout", "0")
    assert cli.main(argv) == 0
    capsys.readouterr()
    run_dir = tmp_path / "run"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert records[-1].get("stop") == 1 and records[-1]["step"] == 7
    best = ckpt_io.best_checkpoint(run_dir)
    assert json.loads((best / ckpt_io.META_FILE).read_text())["step"] in (3, 6)


def test_eval_of_the_best_copy_says_where_better_last_weights_are(tmp_path: Path, capsys) -> None:
    """`relmem eval RUN` reads checkpoints/best; when the run's last evaluation, off the grid,
    beat it (summary.json), a note on stderr names the later weights and how to read them, and
    only then (not when the end was worse, nor when --checkpoint chose)."""
    data = write_sample(tmp_path / "data")
    argv = train_args(data, tmp_path, "run", "--steps", "7", "--task.embedding-dropout", "0")
    assert cli.main(argv) == 0
    run_dir = tmp_path / "run"
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text())
    name = summary["metric"]
    best = summary[f"best_held_out_{name}"]
    assert summary["held_out_step"] == 7 and isinstance(best, float)
    latest = str(run_dir / ckpt_io.CHECKPOINT_DIR / ckpt_io.LATEST_FILE)

    def note_after_eval(end: float, *extra: str) -> str:
        summary_path.write_text(json.dumps(summary | {f"held_out_{name}": end}))
        capsys.readouterr()
        assert cli.main(["eval", str(run_dir), "--device", "cpu", *extra]) == 0
        return "\n".join(line for line in capsys.readouterr().err.splitlines() if "note" in line)

    better, worse = best / 2, best * 2  # the language model's perplexity: lower is better
    note = note_after_eval(better)
    assert "step 7" in note and f"--checkpoint {latest}" in note
    assert note_after_eval(worse) == ""
    assert note_after_eval(better, "--checkpoint", latest) == ""
