"""The ``relmem train / eval / plot`` commands: clear errors on bad values, outputs on good."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relmem import cli
from relmem.train.loop import run


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope"], "unknown task 'nope'"),
        (
            ["nth-farthest", "--model", "dnc9"],
            "model must be one of convlstm, dnc, lstm, none, rmc",
        ),
        (["nth-farthest", "--preset", "huge"], "unknown preset 'huge'"),
        (["nth-farthest", "--batch-size", "0"], "batch_size must be >= 1"),
        (["nth-farthest", "--optim.lr", "-1"], "optim.lr must be > 0"),
        (["nth-farthest", "--task.num-objects", "1"], "task.num_objects must be >= 2"),
        (["lte", "--task.max-length", "100000"], "task.max_length must be <= 100"),
        (["nth-farthest", "--device", "cpu", "--bf16"], "bf16 autocast needs a CUDA device"),
        (["nth-farthest", "--resume", "/nonexistent/run"], "/nonexistent/run does not exist"),
        (["nth-farthest", "--preset", "paper", "--resume", "x"], "exclude each other"),
    ],
)
def test_bad_train_values(args: list[str], message: str, capsys, tmp_path: Path) -> None:
    code = cli.main(["train", *args, "--out-dir", str(tmp_path)])
    assert code == 2
    assert message in " ".join(capsys.readouterr().err.split())
    assert not list(tmp_path.iterdir())  # nothing was written


def test_a_task_whose_extra_is_missing_says_so(monkeypatch, capsys, tmp_path: Path) -> None:
    """Without the rl extra, `relmem train boxworld` (and eval of an RL run) said only
    'unknown task', as if the run were unusable."""
    from relmem.tasks import registry

    monkeypatch.setitem(registry._UNAVAILABLE, "chess", "needs the games extra: pip install x")
    assert cli.main(["train", "chess", "--out-dir", str(tmp_path)]) == 2
    assert "task 'chess' needs the games extra: pip install x" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args", [["--optim.lr", "fast"], ["--device", "tpu"], ["--no-such-flag", "1"]]
)
def test_malformed_overrides_exit_2(args: list[str], capsys) -> None:
    assert cli.main(["train", "nth-farthest", *args]) == 2
    assert args[0] in capsys.readouterr().err


def test_help(capsys) -> None:
    assert cli.main(["train", "--help"]) == 0
    assert "nth-farthest" in capsys.readouterr().out
    assert cli.main(["train", "nth-farthest", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--preset" in out and "--rmc.mem-slots" in out and "--optim.grad-clip" in out


def test_eval_and_plot(tiny, tmp_path: Path, capsys) -> None:
    run(tiny(steps=10, checkpoint_every=10), "nth-farthest")
    capsys.readouterr()
    assert cli.main(["eval", str(tmp_path / "run"), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "held-out accuracy" in out and "rank (0 = the reference itself" in out
    record = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert record["count"] == 64 and set(record["groups"]) <= {"0", "1", "2", "3"}
    assert cli.main(["plot", str(tmp_path / "run"), "--examples", "1"]) == 0
    plots = tmp_path / "run" / "plots"
    assert (plots / "curves.png").stat().st_size > 0
    assert (plots / "attention_example_0.png").stat().st_size > 0
    assert cli.main(["eval", str(tmp_path / "missing")]) == 2
    assert f"{tmp_path / 'missing'} does not exist" in capsys.readouterr().err
    assert cli.main(["eval", str(tmp_path)]) == 2  # a directory, but not a run's
    assert "config.json not found" in capsys.readouterr().err


def test_plot_names_a_png_it_cannot_write(tiny, tmp_path: Path, monkeypatch, capsys) -> None:
    run(tiny(steps=10, checkpoint_every=10), "nth-farthest")
    out = tmp_path / "read-only"

    def read_only(self, path, *args, **kwargs) -> None:  # root writes anyway: no chmod test
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr("matplotlib.figure.Figure.savefig", read_only)
    capsys.readouterr()
    assert cli.main(["plot", str(tmp_path / "run"), "--out", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        f"relmem plot: error: {out / 'curves.png'}: Permission denied "
        f"(writing the plots in {out}; choose another --out DIR)"
    ]


def test_plot_examples_0_draws_the_curves_without_a_checkpoint(tiny, tmp_path: Path) -> None:
    run(tiny(steps=20, checkpoint_every=10), "nth-farthest")
    for weights in (tmp_path / "run" / "checkpoints").glob("step-*/model.safetensors"):
        weights.write_text("junk")
    assert cli.main(["plot", str(tmp_path / "run")]) == 2  # the attention maps need one
    assert cli.main(["plot", str(tmp_path / "run"), "--examples", "0"]) == 0
    plots = tmp_path / "run" / "plots"
    assert (plots / "curves.png").stat().st_size > 0 and not list(plots.glob("attention_*"))


def test_plot_refuses_a_metrics_file_with_nothing_to_draw(tiny, tmp_path: Path, capsys) -> None:
    """A metrics.jsonl whose only line does not parse (read as a torn last line) gave an empty
    curves.png and status 0."""
    run(tiny(steps=10, checkpoint_every=10), "nth-farthest")
    metrics = tmp_path / "run" / "metrics.jsonl"
    metrics.write_text("{not json\n")
    capsys.readouterr()
    assert cli.main(["plot", str(tmp_path / "run"), "--examples", "0"]) == 2
    err = capsys.readouterr().err
    assert f"{metrics} holds no complete record to draw (its only line does not parse)" in err
    assert not (tmp_path / "run" / "plots" / "curves.png").exists()


def test_an_interrupt_is_one_line_and_status_130(monkeypatch, capsys) -> None:
    """Ctrl-C while a command starts (its imports take seconds) or a second one while training
    (the first finishes the step and checkpoints) printed a KeyboardInterrupt traceback."""
    import relmem.commands.demo as demo

    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "main", interrupted)
    assert cli.main(["demo"]) == 130
    assert capsys.readouterr().err.strip() == "relmem demo: interrupted"
