"""A run directory's files under damage: ``latest``, ``metrics.jsonl``, ``run.json``,
``config.json``, and which commands read what (``eval`` and ``plot`` fall back, ``train``
refuses and names the option that would work)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from relmem import cli
from relmem.train import checkpoint as ckpt_io
from relmem.train.lock import RunLock, RunLockedError
from relmem.train.loop import run
from relmem.train.metrics import JsonlLogger, MetricsFileError, read_metrics


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny completed run with checkpoints at steps 10 and 20 (see ``conftest.tiny_config``)."""
    from conftest import tiny_config

    out = tmp_path_factory.mktemp("trained")
    run(tiny_config(out, steps=20, checkpoint_every=10, log_every=5), "nth-farthest")
    return out / "run"


@pytest.fixture
def run_dir(trained: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy" / "run"
    shutil.copytree(trained, copy)
    return copy


def latest(run_dir: Path) -> Path:
    return run_dir / ckpt_io.CHECKPOINT_DIR / ckpt_io.LATEST_FILE


@pytest.mark.parametrize(
    "text", ["/tmp\n", "../../elsewhere/checkpoints/step-00000020\n", "", "\x00 garbage", "."]
)
def test_latest_outside_the_run_is_refused(run_dir: Path, text: str) -> None:
    latest(run_dir).write_text(text)
    with pytest.raises(ckpt_io.CheckpointError, match="not a checkpoint directory of this run"):
        ckpt_io.resolve_checkpoint(run_dir)


def test_latest_through_a_link_out_of_the_run_is_refused(run_dir: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    shutil.copytree(run_dir / "checkpoints" / "step-00000020", outside)
    (run_dir / "checkpoints" / "step-00000099").symlink_to(outside)
    latest(run_dir).write_text("step-00000099\n")
    with pytest.raises(ckpt_io.CheckpointError, match="not a checkpoint directory"):
        ckpt_io.resolve_checkpoint(run_dir)


@pytest.mark.parametrize("damage", ["delete", "garbage", "absolute"])
def test_eval_and_plot_fall_back_to_the_newest_intact_checkpoint(run_dir, damage, capsys):
    if damage == "delete":
        latest(run_dir).unlink()
    else:
        latest(run_dir).write_text("/etc\n" if damage == "absolute" else "junk")
    assert cli.main(["eval", str(run_dir), "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    assert "using the newest intact checkpoint" in captured.err
    assert "step-00000020" in captured.err and "step-00000020" in captured.out
    assert cli.main(["plot", str(run_dir), "--examples", "1"]) == 0
    assert "using the newest intact checkpoint" in capsys.readouterr().err


def test_eval_skips_a_checkpoint_with_damaged_weights(run_dir: Path, capsys) -> None:
    weights = run_dir / "checkpoints" / "step-00000020" / ckpt_io.MODEL_FILE
    weights.write_bytes(weights.read_bytes()[:100])
    assert cli.main(["eval", str(run_dir), "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    assert "model.safetensors is truncated or corrupt" in captured.err
    assert "step-00000010" in captured.out


def test_eval_passes_over_a_damaged_best_to_the_newest_intact_checkpoint(run_dir, capsys):
    """A damaged checkpoints/best was reported with "No earlier checkpoint exists" (a name
    comparison put every step-* after 'best') and no fallback was taken."""
    root = run_dir / ckpt_io.CHECKPOINT_DIR
    shutil.copytree(root / "step-00000010", root / ckpt_io.BEST_NAME)
    assert cli.main(["eval", str(run_dir), "--device", "cpu"]) == 0
    assert f"checkpoint {root / ckpt_io.BEST_NAME} (step 10)" in capsys.readouterr().out
    weights = root / ckpt_io.BEST_NAME / ckpt_io.MODEL_FILE
    weights.write_bytes(weights.read_bytes()[:100])
    assert cli.main(["eval", str(run_dir), "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    assert "best/model.safetensors is truncated" in captured.err
    assert "using the newest intact checkpoint" in captured.err
    assert "step-00000020" in captured.out
    with pytest.raises(
        ckpt_io.CheckpointError, match="previous intact checkpoint is .*step-00000020"
    ):
        ckpt_io.verify_checkpoint(root / ckpt_io.BEST_NAME, (ckpt_io.MODEL_FILE,))


def test_the_suggested_fallback_is_itself_intact(run_dir: Path, capsys) -> None:
    """With step 20's and step 10's training states both damaged, --resume suggested step 10."""
    root = run_dir / ckpt_io.CHECKPOINT_DIR
    for step in ("step-00000010", "step-00000020"):
        (root / step / ckpt_io.STATE_FILE).write_text("junk")
    assert cli.main(["train", "nth-farthest", "--resume", str(run_dir), "--steps", "30"]) == 2
    err = capsys.readouterr().err
    assert "No earlier intact checkpoint exists" in err and "step-00000010" not in err


def test_eval_and_plot_read_no_training_state(run_dir: Path, capsys) -> None:
    (run_dir / "checkpoints" / "step-00000020" / ckpt_io.STATE_FILE).write_text("junk")
    assert cli.main(["eval", str(run_dir), "--device", "cpu"]) == 0
    assert "step-00000020" in capsys.readouterr().out
    assert cli.main(["plot", str(run_dir), "--examples", "1"]) == 0


def test_plot_draws_the_attention_maps_despite_damaged_metrics(run_dir: Path, capsys) -> None:
    (run_dir / "metrics.jsonl").write_text('{"step": 5}\nnot json\n{"step": 10}\n')
    assert cli.main(["plot", str(run_dir), "--examples", "1"]) == 2
    captured = capsys.readouterr()
    assert "metrics.jsonl, line 2" in captured.err and "attention_example_0.png" in captured.out


def test_a_torn_last_line_is_dropped_and_reported(run_dir: Path, tiny, capsys) -> None:
    metrics = run_dir / "metrics.jsonl"
    before = read_metrics(metrics)
    with open(metrics, "a") as f:
        f.write('{"step": 25, "train/lo')
    assert read_metrics(metrics) == before  # readers skip it
    resume = tiny(steps=30, resume=run_dir)
    resume.out_dir = run_dir.parent
    run(resume, "nth-farthest")
    err = capsys.readouterr().err
    assert f"{metrics} ended in a torn line" in err and "step 20" in err
    records = read_metrics(metrics)
    assert records[: len(before)] == before
    assert [r["step"] for r in records[len(before) :]] == [25, 30]


def test_resume_cuts_records_after_the_checkpoint_without_rewriting(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s}) + "\n" for s in (5, 10, 15, 20)]
    path.write_text("".join(lines))
    inode = path.stat().st_ino
    JsonlLogger(path, resume_step=12).close()
    assert path.read_text() == "".join(lines[:2]) and path.stat().st_ino == inode
    path.write_text('{"step": 5}\nnot json\n{"step": 10}\n')
    with pytest.raises(MetricsFileError, match="line 2"):
        JsonlLogger(path, resume_step=10)


def test_a_failed_resume_changes_nothing(run_dir: Path, capsys) -> None:
    (run_dir / "metrics.jsonl").write_text('{"step": 5}\nnot json\n{"step": 10}\n')
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    argv = ["train", "nth-farthest", "--resume", str(run_dir), "--steps", "40"]
    assert cli.main(argv) == 2
    assert "metrics.jsonl, line 2" in capsys.readouterr().err
    after = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    assert after == before


def test_a_damaged_run_json_is_kept_aside_and_the_resume_goes_on(run_dir, capsys) -> None:
    (run_dir / "run.json").write_text('{"invocations": [')
    argv = ["train", "nth-farthest", "--resume", str(run_dir), "--steps", "25"]
    assert cli.main(argv) == 0
    assert "run.json was damaged" in capsys.readouterr().err
    assert (run_dir / "run.json.damaged").read_text() == '{"invocations": ['
    assert len(json.loads((run_dir / "run.json").read_text())["invocations"]) == 1


def test_the_lock_names_its_holder(tmp_path: Path) -> None:
    held = RunLock(tmp_path)
    try:
        with pytest.raises(RunLockedError, match=r"in use by another training process \(pid"):
            RunLock(tmp_path)
    finally:
        held.release()
    RunLock(tmp_path).release()  # free again


def test_a_record_without_a_step_stops_a_resume_instead_of_cutting_there(tmp_path: Path) -> None:
    """A parsable middle line without an integer step cut the file there on resume (80
    records to 6, silently); it is named like an unparsable one."""
    path = tmp_path / "metrics.jsonl"
    text = '{"step": 5}\n{"train/loss": 1}\n{"step": 10}\n'
    path.write_text(text)
    with pytest.raises(MetricsFileError, match="line 2, has no integer step"):
        JsonlLogger(path, resume_step=10)
    assert path.read_text() == text


def _steps(run_dir: Path) -> list[str]:
    return [p.name for p in ckpt_io.list_checkpoints(run_dir)]


def test_resuming_an_earlier_checkpoint_sets_the_later_ones_aside(run_dir: Path, capsys) -> None:
    """Resumed at step 10 of a run that went on to 20 (keep 1): the step-20 checkpoint of the
    replaced history was kept by pruning (the highest step) and the new step-15 deleted; now
    it is moved aside, and latest names the new checkpoint."""
    root = run_dir / ckpt_io.CHECKPOINT_DIR
    shutil.copytree(root / "step-00000020", root / ckpt_io.BEST_NAME)  # best saved at step 20
    older = root / "step-00000010"
    argv = ["train", "nth-farthest", "--resume", str(older), "--steps", "15"]
    assert cli.main([*argv, "--checkpoint-every", "15", "--keep-checkpoints", "1"]) == 0
    aside = run_dir / ckpt_io.CHECKPOINT_DIR / "abandoned-after-step-00000010"
    assert f"kept in {aside}" in capsys.readouterr().out
    assert (aside / "step-00000020").is_dir() and (aside / ckpt_io.BEST_NAME).is_dir()
    assert ckpt_io.best_checkpoint(run_dir) is None
    assert _steps(run_dir) == ["step-00000015"]
    assert ckpt_io.resolve_checkpoint(run_dir).name == "step-00000015"
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")][-1] == 15


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--run-name", "forked", "--run-name cannot change when resuming"),
        ("--out-dir", "elsewhere", "--out-dir cannot change when resuming"),
        ("--model", "lstm", "--model cannot change when resuming"),
        ("--rmc.head-size", "4", r"--rmc\.head-size cannot change when resuming \(the run has 8"),
        ("--head.hidden-sizes", "16", "--head.hidden-sizes cannot change when resuming"),
    ],
)
def test_resume_refuses_a_new_place_or_model(run_dir: Path, option, value, message, capsys):
    """These overrides were taken silently (--run-name, --out-dir: the run stayed where it was
    and its config.json named the new place) or failed in load_state_dict with several KB of
    size mismatches. The implementation may change: it computes the same function."""
    before = (run_dir / "config.json").read_text()
    argv = ["train", "nth-farthest", "--resume", str(run_dir), "--steps", "25"]
    assert cli.main([*argv, option, value]) == 2
    assert capsys.readouterr().err.count("cannot change") == 1
    assert (run_dir / "config.json").read_text() == before
    with pytest.raises(ValueError, match=message):
        from relmem.commands.train import parse

        parse(["nth-farthest", "--resume", str(run_dir), option, value])
    assert cli.main([*argv, "--rmc.implementation", "reference"]) == 0


def test_resume_refuses_fewer_steps_than_it_has_taken(run_dir: Path, capsys) -> None:
    """--steps 10 on a run at step 20 reported 'completed' and wrote steps 10 into its config."""
    before = (run_dir / "config.json").read_text()
    assert cli.main(["train", "nth-farthest", "--resume", str(run_dir), "--steps", "10"]) == 2
    assert "--steps 10 is below the step of" in capsys.readouterr().err
    assert (run_dir / "config.json").read_text() == before


@pytest.mark.parametrize("contents", ["config.json", "notes.txt"])
def test_a_new_run_refuses_a_directory_that_is_not_empty(tmp_path: Path, tiny, contents) -> None:
    """A run directory without checkpoints (deleted to save space, or a first run killed
    early) lost its metrics and config to a new run of the same name; a folder of other files
    got run files written among them."""
    occupied = tmp_path / "run"
    occupied.mkdir()
    (occupied / contents).write_text("{}")
    with pytest.raises(FileExistsError, match=f"not empty \\({contents}\\)"):
        run(tiny(), "nth-farthest")
    assert [p.name for p in occupied.iterdir()] == [contents]


def test_resume_and_eval_take_latest_and_name_other_files(run_dir: Path, capsys) -> None:
    """--resume RUN/checkpoints/latest said it 'holds no checkpoint', --resume of a file
    failed on 'FILE/.lock: Not a directory'."""
    assert cli.main(["eval", str(latest(run_dir)), "--device", "cpu"]) == 2  # not a run dir
    capsys.readouterr()
    argv = ["eval", str(run_dir), "--device", "cpu", "--checkpoint", str(latest(run_dir))]
    assert cli.main(argv) == 0
    assert "step-00000020" in capsys.readouterr().out
    resume = ["train", "nth-farthest", "--resume", str(latest(run_dir)), "--steps", "25"]
    assert cli.main(resume) == 0
    assert ckpt_io.resolve_checkpoint(run_dir).name == "step-00000025"
    notes = run_dir / "notes.txt"
    notes.write_text("")
    assert cli.main(["train", "nth-farthest", "--resume", str(notes)]) == 2
    assert f"{notes} is a file; pass a run directory" in capsys.readouterr().err


# --- links, races, large steps, full disks (an audit's reproductions) --------------------------


@pytest.mark.parametrize("name", [".lock", "metrics.jsonl"])
def test_a_run_file_that_is_a_link_is_refused_not_written_through(
    run_dir: Path, tmp_path: Path, name: str, capsys
) -> None:
    """A resume wrote its pid into the file a .lock link named, and cut and appended to the
    file a metrics.jsonl link named."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    path = run_dir / name
    path.unlink(missing_ok=True)
    path.symlink_to(victim)
    assert cli.main(["train", "nth-farthest", "--resume", str(run_dir), "--steps", "25"]) == 2
    assert "is a symbolic link" in capsys.readouterr().err
    assert victim.read_text() == "precious\n"


def test_checkpoints_through_links_are_not_the_run_s(run_dir: Path, tmp_path: Path, capsys):
    """A checkpoints/ linked to another run's let a resume prune and overwrite that run's
    checkpoints; a linked step directory was evaluated as the run's own."""
    other = tmp_path / "other"
    shutil.copytree(run_dir, other)
    checkpoints = run_dir / ckpt_io.CHECKPOINT_DIR
    shutil.rmtree(checkpoints)
    checkpoints.symlink_to(other / ckpt_io.CHECKPOINT_DIR)
    assert cli.main(["train", "nth-farthest", "--resume", str(run_dir), "--steps", "40"]) == 2
    assert "is a symbolic link" in capsys.readouterr().err
    assert sorted(p.name for p in ckpt_io.list_checkpoints(other)) == [
        "step-00000010",
        "step-00000020",
    ]
    assert ckpt_io.list_checkpoints(run_dir) == []
    checkpoints.unlink()
    checkpoints.mkdir()
    (checkpoints / "step-00000099").symlink_to(other / ckpt_io.CHECKPOINT_DIR / "step-00000020")
    assert ckpt_io.list_checkpoints(run_dir) == []
    with pytest.raises(ckpt_io.CheckpointError, match="is a symbolic link"):
        ckpt_io.resolve_checkpoint(checkpoints / "step-00000099")


def test_checkpoints_past_eight_digits_keep_their_order(tmp_path: Path) -> None:
    """step-100000000 sorted before step-99999995 by name: pruning deleted the checkpoint just
    written and latest named a missing directory."""
    root = tmp_path / ckpt_io.CHECKPOINT_DIR
    for step in (99_999_990, 99_999_995, 100_000_000):
        (root / ckpt_io.checkpoint_name(step)).mkdir(parents=True)
    names = [p.name for p in ckpt_io.list_checkpoints(tmp_path)]
    assert names == ["step-99999990", "step-99999995", "step-100000000"]


def test_a_new_run_of_a_taken_name_is_refused_under_the_lock(tmp_path: Path, tiny, monkeypatch):
    """Two new runs of one name: the second passed the emptiness check, then (slow to set up)
    started over in the directory the first had filled meanwhile, wiping its metrics."""
    import relmem.train.trainer as trainer_module

    real = trainer_module.new_run_dir

    def first_run_fills_it(*args, **kwargs):
        run_dir = real(*args, **kwargs)
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.jsonl").write_text('{"step": 5}\n')
        return run_dir

    monkeypatch.setattr(trainer_module, "new_run_dir", first_run_fills_it)
    with pytest.raises(FileExistsError, match=r"not empty \(metrics.jsonl\)"):
        run(tiny(), "nth-farthest")
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == '{"step": 5}\n'


def test_a_resume_with_nothing_to_train_keeps_the_final_records(tmp_path: Path, tiny) -> None:
    """A run that ended off its evaluation grid, resumed with the same --steps (as after a kill
    between its last checkpoint and its summary), lost its final stop record."""
    config = tiny(steps=23)
    run(config, "nth-farthest")
    path = tmp_path / "run" / "metrics.jsonl"
    before = path.read_text()
    assert json.loads(before.splitlines()[-1]).get("stop") == 1
    result = run(tiny(steps=23, resume=tmp_path / "run"), "nth-farthest")
    assert result.status == "completed"
    assert path.read_text() == before


def test_a_full_disk_during_a_checkpoint_is_one_error_and_loses_nothing(
    run_dir: Path, monkeypatch, capsys
) -> None:
    def full(*args, **kwargs):
        raise RuntimeError("basic_ios::clear: iostream error")

    monkeypatch.setattr(ckpt_io.torch, "save", full)
    assert cli.main(["train", "nth-farthest", "--resume", str(run_dir), "--steps", "30"]) == 2
    err = capsys.readouterr().err
    assert "cannot write the checkpoint's train_state.pt" in err and "is the disk full" in err
    checkpoints = run_dir / ckpt_io.CHECKPOINT_DIR
    assert not list(checkpoints.glob(".*partial"))
    assert ckpt_io.resolve_checkpoint(run_dir).name == "step-00000020"
    ckpt_io.verify_checkpoint(ckpt_io.resolve_checkpoint(run_dir))


def test_best_is_found_when_a_kill_struck_between_its_two_renames(tmp_path: Path) -> None:
    """Replacing best deleted the old copy before the new one was in place: a kill there left
    no best, and eval silently used latest."""
    root = tmp_path / ckpt_io.CHECKPOINT_DIR
    aside = root / ".best.previous"
    aside.mkdir(parents=True)
    (aside / ckpt_io.META_FILE).write_text("{}")
    assert ckpt_io.best_checkpoint(tmp_path) == aside


def test_a_training_state_that_is_not_plain_data_names_the_fallback(run_dir: Path) -> None:
    """A hash-valid train_state.pt holding other objects repeated torch's advice to load it
    with weights_only=False, and named no intact checkpoint."""
    ckpt = run_dir / ckpt_io.CHECKPOINT_DIR / "step-00000020"
    state = ckpt / ckpt_io.STATE_FILE
    ckpt_io.torch.save({"format_version": 1, "payload": Path("x")}, state)
    meta = json.loads((ckpt / ckpt_io.META_FILE).read_text())
    meta["sha256"][ckpt_io.STATE_FILE] = ckpt_io._sha256(state)
    (ckpt / ckpt_io.META_FILE).write_text(json.dumps(meta))
    with pytest.raises(ckpt_io.CheckpointError) as info:
        ckpt_io.load_train_state(ckpt)
    assert "weights_only" not in str(info.value) and "not a relmem training state" in str(
        info.value
    )
    assert info.value.fallback == run_dir / ckpt_io.CHECKPOINT_DIR / "step-00000010"


def test_run_files_hold_strict_json(tmp_path: Path) -> None:
    """eval.json and summary.json held NaN, which JSON has not (strict readers refuse it)."""
    from relmem.train.runs import write_json

    path = tmp_path / "eval.json"
    write_json(path, {"loss": float("nan"), "groups": [float("inf"), 1.5], "step": 3})
    assert json.loads(path.read_text(), parse_constant=pytest.fail) == {
        "loss": None,
        "groups": [None, 1.5],
        "step": 3,
    }


def test_plot_draws_the_curves_of_a_run_without_maps_or_checkpoints(tmp_path: Path, tiny, capsys):
    """An LSTM run killed before its first checkpoint could not be plotted ("holds no
    checkpoint"), though an LSTM has no attention maps to read weights for."""
    run(tiny(model="lstm", steps=10), "nth-farthest")
    shutil.rmtree(tmp_path / "run" / ckpt_io.CHECKPOINT_DIR)
    assert cli.main(["plot", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "no attention maps: model 'lstm' has no attention" in out and "curves.png" in out


def test_a_model_option_edited_in_config_json_is_refused_at_resume(run_dir: Path, capsys):
    """config.json's rmc.forget_bias edited by hand: the resume built another model on the
    checkpoint's weights and trained on, without a word (the command line's override of the
    same option was refused)."""
    path = run_dir / "config.json"
    config = json.loads(path.read_text())
    config["rmc"]["forget_bias"] = 50.0
    path.write_text(json.dumps(config))
    before = path.read_text()
    assert cli.main(["train", "nth-farthest", "--resume", str(run_dir), "--steps", "25"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "was trained with rmc.forget_bias = 1.0" in err and "now says 50.0" in err
    assert path.read_text() == before


@pytest.mark.parametrize(
    ("section", "field", "value", "was"),
    [
        ("rmc", "forget_bias", 50.0, "1.0"),
        ("rmc", "mem_slots", 3, None),
        ("head", None, None, None),
    ],
    ids=["an option", "a size", "the head"],
)
def test_eval_and_plot_refuse_a_model_edited_in_config_json(
    run_dir: Path, capsys, section: str, field: str | None, value: object, was: str | None
):
    """As a resume does (one copy of the check): an edited size failed as a weight-shape
    mismatch that blamed model.safetensors, and an edited option (forget_bias) evaluated
    another model on the weights without a word."""
    path = run_dir / "config.json"
    config = json.loads(path.read_text())
    if field is None:  # the head's widths
        config["head"]["hidden_sizes"] = [5]
        option = "head.hidden_sizes"
    else:
        was = was or repr(config[section][field])
        config[section][field] = value
        option = f"{section}.{field}"
    path.write_text(json.dumps(config))
    capsys.readouterr()
    for command in (["eval", str(run_dir)], ["plot", str(run_dir), "--examples", "1"]):
        assert cli.main(command) == 2, command
        err = " ".join(capsys.readouterr().err.split())
        assert f"was trained with {option} = " in err, (command, err)
        assert "config.json now says" in err and "restore it" in err, err
        assert "model.safetensors" not in err, err
        if was is not None:
            assert f"{option} = {was}," in err, err


def test_a_resume_cuts_the_record_right_after_its_step(tmp_path: Path) -> None:
    """Records at steps 9..12 resumed at 10 keep 9 and 10 exactly (a cut one record late was
    caught only by the slow kill-and-resume comparison)."""
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": step}) + "\n" for step in (9, 10, 11, 12)]
    path.write_text("".join(lines))
    JsonlLogger(path, resume_step=10).close()
    assert path.read_text() == "".join(lines[:2])
