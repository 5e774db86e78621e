"""Hostile use of runs (issue 43): each misuse ends in one line on stderr that names the file or
the option and the fix, exit status 2, and nothing written."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from relmem import cli
from relmem.files import file_digest

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "squad"

# the reading tests' tiny reader (tests/reading/reading_sample.py), trained in seconds
TINY_READER = [
    "--task.word-size", "16", "--task.char-embedding", "4", "--task.char-channels", "8",
    "--task.hidden-size", "8", "--task.attention-window", "16", "--task.min-char-count", "1",
    "--dnc.memory-size", "4", "--dnc.word-size", "4", "--dnc.num-read-heads", "1",
]  # fmt: skip
NTH_FARTHEST = [
    "train", "nth-farthest", "--device", "cpu", "--cpu-threads", "1", "--steps", "2",
    "--batch-size", "8", "--eval-every", "2", "--checkpoint-every", "2", "--eval-batch", "8",
    "--task.test-size", "8", "--task.num-objects", "4", "--task.num-features", "4",
    "--rmc.mem-slots", "2", "--rmc.num-heads", "1", "--rmc.head-size", "4",
    "--head.hidden-sizes", "8", "--no-tensorboard",
]  # fmt: skip


def squad_folder(folder: Path, train: str = "sample-v1.1.json") -> Path:
    """``folder`` holding the sample as ``train-v1.1.json`` (``train`` of the sample files)
    and ``dev-v1.1.json``."""
    folder.mkdir(parents=True)
    shutil.copy(SAMPLE / train, folder / "train-v1.1.json")
    shutil.copy(SAMPLE / "sample-v1.1.json", folder / "dev-v1.1.json")
    return folder


def squad_args(data: Path, out: Path, name: str, *extra: str) -> list[str]:
    """``relmem train squad`` of the tiny reader on ``data`` for 2 steps."""
    return [
        "train", "squad", "--data-dir", str(data), "--device", "cpu", "--cpu-threads", "1",
        "--steps", "2", "--batch-size", "8", "--eval-every", "2", "--log-every", "2",
        "--checkpoint-every", "2", "--out-dir", str(out), "--run-name", name,
        "--no-tensorboard", *TINY_READER, *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def squad_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return squad_folder(tmp_path_factory.mktemp("data") / "squad")


def refused(capsys: pytest.CaptureFixture[str], argv: list[str], *names: str) -> str:
    """Run ``relmem argv``; check it exits 2 with one error line, its last on stderr (a task
    may describe its data before), naming every one of ``names``; return the line."""
    capsys.readouterr()
    assert cli.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in lines if ": error: " in line]
    assert len(errors) == 1 and errors[0] == lines[-1], lines
    for name in names:
        assert name in errors[0], errors[0]
    return errors[0]


# 1. options the chosen task's model never reads


@pytest.mark.parametrize(
    ("extra", "names"),
    [
        (("--dnc.num-write-heads", "3"), ("--dnc.num-write-heads 3", "--dnc.memory-size")),
        (("--dnc.hidden-size", "9"), ("--dnc.hidden-size 9", "leave it out")),
        (("--dnc.clip-value", "5"), ("--dnc.clip-value 5.0",)),
        (("--head.hidden-sizes", "7"), ("--head.hidden-sizes 7", "no MLP head")),
        (("--model", "rmc", "--head.hidden-sizes", "7", "9"), ("--head.hidden-sizes 7 9",)),
    ],
    ids=["dnc-write-heads", "dnc-hidden-size", "dnc-clip", "head", "head-rmc"],
)
def test_train_refuses_an_option_the_reader_never_reads(
    squad_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra, names
) -> None:
    refused(capsys, squad_args(squad_data, tmp_path, "run", *extra), *names)
    assert not (tmp_path / "run").exists()


def test_train_refuses_a_head_on_a_per_step_task(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["train", "repeat-copy", "--device", "cpu", "--steps", "1", "--out-dir",
            str(tmp_path), "--run-name", "run", "--head.hidden-sizes", "7"]  # fmt: skip
    refused(capsys, argv, "--head.hidden-sizes 7", "'per_step'")
    assert not (tmp_path / "run").exists()


# 2. a checkpoint of another run, trained on another file of the same sizes


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory, squad_data: Path) -> tuple[Path, Path]:
    """Two finished squad runs whose vocabularies have the same sizes and other ids: ``a`` on
    the sample, ``b`` on the sample with its articles in reverse order."""
    root = tmp_path_factory.mktemp("two")
    other = squad_folder(root / "reversed")
    sample = json.loads((other / "train-v1.1.json").read_text())
    sample["data"].reverse()
    (other / "train-v1.1.json").write_text(json.dumps(sample))
    assert cli.main(squad_args(squad_data, root, "a")) == 0
    assert cli.main(squad_args(other, root, "b")) == 0
    identities = [json.loads((root / n / "data.json").read_text())["vocabulary"] for n in "ab"]
    assert identities[0]["words"] == identities[1]["words"]
    assert identities[0]["sha1"] != identities[1]["sha1"]
    return root / "a", root / "b"


def without_data_identity(run: Path, copy: Path) -> Path:
    """A copy of ``run`` whose checkpoints predate the data identity in ``meta.json``."""
    shutil.copytree(run, copy)
    for meta in copy.glob("checkpoints/*/meta.json"):
        record = json.loads(meta.read_text())
        del record["data_identity"]
        meta.write_text(json.dumps(record))
    return copy


def step_2(run: Path) -> Path:
    return run / "checkpoints" / "step-00000002"


@pytest.mark.parametrize("command", ["eval", "answer", "export"])
def test_a_checkpoint_of_other_data_is_refused(
    two_runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    a, b = two_runs
    context = tmp_path / "context.txt"
    context.write_text("Karl von Frisch decoded the dance.")
    argv = {
        "eval": ["eval", str(a), "--json-out", str(tmp_path / "eval.json")],
        "answer": ["answer", str(a), "--context", str(context), "--question", "Who?"],
        "export": ["export", str(a), str(tmp_path / "out")],
    }[command]
    refused(capsys, [*argv, "--checkpoint", str(step_2(b))], "--checkpoint", "other data", str(b))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["context.txt"]
    # a checkpoint from before meta.json recorded the data: only the run's own is taken
    old = without_data_identity(b, tmp_path / "b-old")
    refused(capsys, [*argv, "--checkpoint", str(step_2(old))], "before checkpoints recorded")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b-old", "context.txt"]


def test_a_runs_own_checkpoint_from_before_the_record_is_taken(
    two_runs: tuple[Path, Path], tmp_path: Path
) -> None:
    old = without_data_identity(two_runs[0], tmp_path / "a-old")
    out = tmp_path / "eval.json"
    assert (
        cli.main(["eval", str(old), "--checkpoint", str(step_2(old)), "--json-out", str(out)]) == 0
    )
    assert cli.main(["eval", str(two_runs[0]), "--checkpoint", str(step_2(two_runs[0])),
                     "--json-out", str(out)]) == 0  # fmt: skip


# 3. a second evaluation on other data, or a record named like the predictions


def test_evaluations_on_other_data_keep_each_others_predictions(
    two_runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = shutil.copytree(two_runs[0], tmp_path / "run")
    other = tmp_path / "other-dev.json"  # the sample's articles but its first
    sample = json.loads((SAMPLE / "sample-v1.1.json").read_text())
    other.write_text(json.dumps(sample | {"data": sample["data"][1:]}))
    same_name = tmp_path / "elsewhere" / "other-dev.json"  # other data, the same file name
    same_name.parent.mkdir()
    same_name.write_text(json.dumps(sample | {"data": sample["data"][2:]}))
    assert cli.main(["eval", str(run)]) == 0
    assert cli.main(["eval", str(run), "--data", str(other)]) == 0
    name = f"eval-predictions-other-dev-{file_digest(other, 'sha1')[:10]}.json"
    record = json.loads((run / "eval.json").read_text())
    assert record["predictions"] == name
    assert cli.main(["eval", str(run), "--data", str(same_name)]) == 0
    held_out = json.loads((run / "eval-predictions-held-out.json").read_text())
    on_other = json.loads((run / name).read_text())
    on_same_name = json.loads(
        (run / json.loads((run / "eval.json").read_text())["predictions"]).read_text()
    )
    assert len({frozenset(held_out), frozenset(on_other), frozenset(on_same_name)}) == 3
    out = tmp_path / "records" / "step-2.json"
    out.parent.mkdir()
    assert cli.main(["eval", str(run), "--json-out", str(out)]) == 0
    assert (out.parent / "step-2-predictions-held-out.json").is_file()
    # a record named like a predictions file would overwrite one
    before = (run / "eval-predictions-held-out.json").read_bytes()
    for name in ("eval-predictions-held-out.json", "x-predictions-y.json"):
        refused(capsys, ["eval", str(run), "--json-out", str(run / name)], "--json-out", name)
    assert (run / "eval-predictions-held-out.json").read_bytes() == before
    assert not (run / "x-predictions-y.json").exists()


@pytest.mark.parametrize("name", ["config.json", "predictions.json", "eval.json"])
def test_json_out_never_replaces_a_file_that_is_not_a_record(
    nth_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """A run's config.json (or a predictions file of an older relmem) is not a record."""
    run = shutil.copytree(nth_run, tmp_path / "run")
    target = run / name
    if name != "config.json":
        target.write_text('{"q1": "an answer"}')
    before = target.read_bytes()
    refused(capsys, ["eval", str(run), "--json-out", str(target)], f"--json-out {target}")
    assert target.read_bytes() == before
    assert cli.main(["eval", str(run), "--json-out", str(tmp_path / "e.json")]) == 0
    assert cli.main(["eval", str(run), "--json-out", str(tmp_path / "e.json")]) == 0  # a record


# 4. sizes too large to count, in a new run or a run's config.json

HUGE = {"head_size": 2**20, "num_heads": 2**10}


@pytest.fixture(scope="module")
def nth_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 2-step Nth Farthest run of a tiny RMC."""
    out = tmp_path_factory.mktemp("nth")
    assert cli.main([*NTH_FARTHEST, "--out-dir", str(out), "--run-name", "run"]) == 0
    return out / "run"


def test_a_new_run_of_sizes_too_large_to_count_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sizes = ["--rmc.head-size", str(HUGE["head_size"]), "--rmc.num-heads", str(HUGE["num_heads"])]
    argv = [*NTH_FARTHEST, "--out-dir", str(tmp_path), "--run-name", "run", *sizes]
    refused(capsys, argv, "--rmc.head-size 1048576", "--rmc.num-heads 1024", "--max-parameters")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("sizes", "names"),
    [
        (  # a DNC of 2**20 slots has the parameters of one of 16; its link is 2**40 numbers
            ["--model", "dnc", "--dnc.memory-size", str(2**20), "--dnc.word-size", "4"],
            ["--dnc.memory-size 1048576", "1,099,5"],
        ),
        (  # an RMC of 16,384 one-wide slots: 2**14 parameters a slot, scores of 2**28
            ["--rmc.mem-slots", "16384", "--rmc.head-size", "1"],
            ["--rmc.mem-slots 16384", "268,4"],
        ),
    ],
    ids=["dnc-link", "rmc-attention"],
)
def test_a_new_run_whose_memory_would_not_fit_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sizes: list[str], names: list[str]
) -> None:
    argv = [*NTH_FARTHEST, "--out-dir", str(tmp_path), "--run-name", "run", *sizes]
    refused(capsys, argv, *names, "numbers of recurrent state")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["eval", "plot", "resume"])
def test_a_config_json_of_sizes_too_large_to_count_is_refused(
    nth_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    run = shutil.copytree(nth_run, tmp_path / "run")
    config = json.loads((run / "config.json").read_text())
    config["rmc"] |= HUGE
    (run / "config.json").write_text(json.dumps(config))
    before = sorted(str(p.relative_to(run)) for p in run.rglob("*"))
    argv = {
        "eval": ["eval", str(run)],
        "plot": ["plot", str(run), "--out", str(tmp_path / "plots")],
        "resume": ["train", "nth-farthest", "--resume", str(run), "--steps", "4"],
    }[command]
    refused(capsys, argv, "--rmc.head-size 1048576", "--rmc.num-heads 1024", "--max-parameters")
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*")) == before
    assert not (tmp_path / "plots").exists()


# 5. a run killed before its first checkpoint


def killed_before_its_first_checkpoint(nth_run: Path, run: Path) -> Path:
    """``run``: what a kill before the first checkpoint leaves of ``nth_run`` (its config,
    run record, first metrics and a stale lock file, no checkpoint)."""
    run.mkdir()
    for name in ("config.json", "run.json"):
        shutil.copy(nth_run / name, run / name)
    (run / "metrics.jsonl").write_text('{"step": 1, "train/loss": 1.0}\n')
    (run / ".lock").touch()
    return run


def test_a_run_killed_before_its_first_checkpoint_trains_again_from_step_0(
    nth_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = killed_before_its_first_checkpoint(nth_run, tmp_path / "run")
    # a new run under its name says how to go on
    argv = [*NTH_FARTHEST, "--out-dir", str(tmp_path), "--run-name", "run"]
    refused(capsys, argv, f"--resume {run} trains from step 0")
    assert cli.main(["train", "nth-farthest", "--resume", str(run)]) == 0
    assert f"{run} holds no checkpoint" in capsys.readouterr().err
    # the killed attempt's records are replaced by a whole run's
    steps = [
        [json.loads(line)["step"] for line in (r / "metrics.jsonl").open()] for r in (run, nth_run)
    ]
    assert steps[0] == steps[1]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["status"] == "completed"
    assert json.loads((run / "config.json").read_text())["resume"] is None


# 6. the record names the checkpoint relative to the run, not by this machine's path


@pytest.mark.parametrize("checkpoint", [None, "checkpoints/step-00000002"])
def test_the_eval_record_names_the_checkpoint_relative_to_the_run(
    nth_run: Path, tmp_path: Path, checkpoint: str | None
) -> None:
    out = tmp_path / "eval.json"
    chosen = [] if checkpoint is None else ["--checkpoint", str(nth_run / checkpoint)]
    assert cli.main(["eval", str(nth_run), "--json-out", str(out), *chosen]) == 0
    assert json.loads(out.read_text())["checkpoint"] == "checkpoints/step-00000002"


# a run's JSON files that are not what relmem wrote


def fifo(path: Path) -> None:
    os.mkfifo(path)


def nested(path: Path) -> None:
    path.write_text("[" * 100_000 + "]" * 100_000)


def huge(path: Path) -> None:
    with path.open("wb") as f:
        f.truncate(64 << 20)  # sparse: nothing is written


@pytest.mark.parametrize("damage", [fifo, nested, huge], ids=["fifo", "nested", "huge"])
@pytest.mark.parametrize("name", ["config.json", "checkpoints/step-00000002/meta.json"])
def test_a_hostile_json_file_of_a_run_is_refused_before_it_is_read(
    nth_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], damage, name: str
) -> None:
    run = shutil.copytree(nth_run, tmp_path / "run")
    (run / name).unlink()
    damage(run / name)
    argv = ["eval", str(run), "--checkpoint", str(step_2(run)), "--json-out", str(tmp_path / "e")]
    refused(capsys, argv, name.rpartition("/")[2])
    assert not (tmp_path / "e").exists()
