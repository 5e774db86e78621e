"""Bad input to the ``relmem`` commands: one line on stderr naming what is wrong, exit 2.

A table: each row is a command line, an optional way to spoil a trained run first, and the
words the error must contain (the option, argument or file it names). Every row is run in
process through :func:`relmem.cli.main`; an exception escaping it is a traceback and fails.
To cover a new command or task, add rows (``{run}`` is a fresh copy of a trained tiny run,
``{tmp}`` an empty directory, ``{file}`` a regular file in it).

Errors that tyro reports while parsing (a malformed value, an unknown flag, a value the config
class refuses) come boxed over several lines; rows of that kind set ``boxed``.
"""

# ruff: noqa: E501 - the table keeps one case a line

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from relmem import cli
from relmem.models import HeadConfig, RMCModelConfig
from relmem.tasks import NthFarthestConfig
from relmem.train.config import OptimConfig, TrainConfig
from relmem.train.loop import run

Spoil = Callable[[Path], None]


@dataclass(frozen=True)
class Case:
    """One bad command line.

    Attributes:
        argv: the arguments after ``relmem`` (placeholders ``{run}``, ``{tmp}``, ``{file}``).
        names: words the one-line error must contain.
        spoil: damages the copy of the trained run before the command runs.
        boxed: a tyro parse error (several lines, still exit 2 and no traceback).
    """

    argv: tuple[str, ...]
    names: tuple[str, ...]
    spoil: Spoil | None = None
    boxed: bool = False


def write(relative: str, text: str) -> Spoil:
    return lambda run_dir: (run_dir / relative).write_text(text)


def edit_config(**changes: object) -> Spoil:
    def spoil(run_dir: Path) -> None:
        path = run_dir / "config.json"
        data = json.loads(path.read_text())
        for dotted, value in changes.items():
            *parents, key = dotted.split("__")
            node = data
            for parent in parents:
                node = node[parent]
            node[key] = value
        path.write_text(json.dumps(data))

    return spoil


def remove(relative: str) -> Spoil:
    return lambda run_dir: (run_dir / relative).unlink()


LATEST = "checkpoints/latest"
# a one-step run, should the input be accepted (the error's row then fails)
QUICK = ("--steps", "1", "--batch-size", "2", "--eval-batch", "2", "--task.test-size", "2")
TRAIN = (
    "train",
    "nth-farthest",
    "--device",
    "cpu",
    "--no-tensorboard",
    "--out-dir",
    "{tmp}",
    *QUICK,
)
RESUME = ("train", "nth-farthest", "--resume", "{run}", "--steps", "21")

CASES: dict[str, Case] = {
    # train: values
    "train-copy-resumes-nth-farthest": Case(("train", "copy", "--resume", "{run}", "--steps", "21"), ("--resume", "nth-farthest")),
    "seed-past-64-bits": Case((*TRAIN, "--seed", str(2**64)), ("seed",), boxed=True),
    "seed-below-64-bits": Case((*TRAIN, "--seed", str(-(2**63) - 1)), ("seed",), boxed=True),
    "eps-negative": Case((*TRAIN, "--optim.eps", "-1"), ("optim.eps",), boxed=True),
    "weight-decay-negative": Case((*TRAIN, "--optim.weight-decay", "-0.1"), ("optim.weight_decay",), boxed=True),
    "lr-nan": Case((*TRAIN, "--optim.lr", "nan"), ("optim.lr",), boxed=True),
    "grad-clip-inf": Case((*TRAIN, "--optim.grad-clip", "inf"), ("optim.grad_clip",), boxed=True),
    "run-name-empty": Case((*TRAIN, "--run-name", ""), ("run_name",), boxed=True),
    "run-name-escapes": Case((*TRAIN, "--run-name", "../elsewhere"), ("run_name",), boxed=True),
    "out-dir-is-a-file": Case((*TRAIN, "--out-dir", "{file}"), ("{file}",)),
    "out-dir-under-a-file": Case((*TRAIN, "--out-dir", "{file}/runs"), ("{file}",)),
    "model-too-big": Case((*TRAIN, "--model", "lstm", "--lstm.hidden-size", "20000"), ("parameters", "--max-parameters")),
    "model-sizes-overflow": Case((*TRAIN, "--rmc.mem-slots", str(10**18)), ("too large to build",)),
    "time-limit-zero": Case((*TRAIN, "--time-limit-min", "0"), ("time_limit_min",), boxed=True),
    "lr-not-a-number": Case((*TRAIN, "--optim.lr", "fast"), ("--optim.lr",), boxed=True),
    "unknown-flag": Case((*TRAIN, "--no-such-flag", "1"), ("--no-such-flag",), boxed=True),
    # train: the RL tasks' options (docs/rl.md §4)
    "rl-unknown-preset": Case(("train", "boxworld", "--preset", "fast"), ("fast", "cpu", "paper")),
    "rl-unknown-observation": Case(("train", "boxworld", "--task.observation", "pixels"), ("--task.observation",), boxed=True),
    "rl-unknown-algorithm": Case(("train", "boxworld", "--task.algorithm", "sac"), ("--task.algorithm",), boxed=True),
    "rl-entropy-inf": Case(("train", "boxworld", "--task.entropy-coeff", "inf"), ("task.entropy_coeff", "finite"), boxed=True),
    "rl-clip-epsilon-inf": Case(("train", "boxworld", "--task.clip-epsilon", "inf"), ("task.clip_epsilon", "finite"), boxed=True),
    "rl-unknown-pacman-task": Case(("train", "minipacman", "--task.task", "chase"), ("--task.task",), boxed=True),
    "rl-unroll-zero": Case(("train", "boxworld", "--task.unroll", "0"), ("task.unroll",), boxed=True),
    "rl-target-kl-negative": Case(("train", "boxworld", "--task.target-kl", "-0.01"), ("task.target_kl", "> 0"), boxed=True),
    "rl-path-does-not-fit": Case(("train", "boxworld", "--task.grid-size", "5", "--task.solution-length", "20", "--out-dir", "{tmp}"), ("solution_length",)),
    # train --resume: the run's files
    "resume-missing": Case(("train", "nth-farthest", "--resume", "{tmp}/none"), ("{tmp}/none",)),
    "resume-not-a-run": Case(("train", "nth-farthest", "--resume", "{tmp}"), ("{tmp}",)),
    "resume-latest-absolute": Case(RESUME, ("latest",), write(LATEST, "/tmp\n")),
    "resume-latest-parent": Case(RESUME, ("latest",), write(LATEST, "../../other/checkpoints/step-00000010\n")),
    "resume-latest-empty": Case(RESUME, ("latest",), write(LATEST, "")),
    "resume-latest-garbage": Case(RESUME, ("latest",), write(LATEST, "\x00\xff garbage")),
    "resume-latest-deleted": Case(RESUME, ("latest", "--resume", "step-00000020"), remove(LATEST)),
    "resume-config-null": Case(RESUME, ("config.json",), write("config.json", "null")),
    "resume-config-list": Case(RESUME, ("config.json",), write("config.json", "[1, 2]")),
    "resume-config-not-json": Case(RESUME, ("config.json",), write("config.json", "{oops")),
    "resume-config-unknown-key": Case(RESUME, ("config.json", "bogus"), edit_config(bogus=1)),
    "resume-config-wrong-type": Case(RESUME, ("config.json", "steps"), edit_config(steps="many")),
    "resume-config-unknown-task": Case(RESUME, ("config.json", "task_name"), edit_config(task_name="nope")),
    "resume-config-huge-model": Case(RESUME, ("parameters", "--max-parameters"), edit_config(rmc__mem_slots=4096, rmc__head_size=4096)),
    "resume-state-damaged": Case(RESUME, ("train_state.pt", "--resume"), write("checkpoints/step-00000020/train_state.pt", "junk")),
    # eval
    "eval-missing-run": Case(("eval", "{tmp}/none"), ("{tmp}/none", "does not exist")),
    "play-scale-zero": Case(("play", "{run}", "--scale", "0"), ("--scale",)),
    "train-resume-a-file": Case(("train", "nth-farthest", "--resume", "{file}"), ("{file}", "is a file")),
    "eval-config-null": Case(("eval", "{run}"), ("config.json",), write("config.json", "null")),
    "eval-config-list": Case(("eval", "{run}"), ("config.json",), write("config.json", "[]")),
    "eval-config-huge-model": Case(("eval", "{run}"), ("parameters", "--max-parameters"), edit_config(lstm__hidden_size=20000, model="lstm")),
    "eval-json-out-missing-dir": Case(("eval", "{run}", "--json-out", "{tmp}/no/such/dir.json"), ("--json-out",)),
    "eval-json-out-is-a-dir": Case(("eval", "{run}", "--json-out", "{tmp}"), ("--json-out",)),
    "eval-test-size-zero": Case(("eval", "{run}", "--test-size", "0"), ("--test-size",)),
    "eval-checkpoint-missing": Case(("eval", "{run}", "--checkpoint", "{tmp}/none"), ("{tmp}/none",)),
    "eval-checkpoint-elsewhere": Case(("eval", "{run}", "--checkpoint", "{tmp}"), ("{tmp}",)),
    "eval-checkpoint-damaged": Case(("eval", "{run}", "--checkpoint", "{run}/checkpoints/step-00000020"), ("model.safetensors", "--checkpoint", "step-00000010"), write("checkpoints/step-00000020/model.safetensors", "junk")),
    "eval-device-unknown": Case(("eval", "{run}", "--device", "gpu0"), ("gpu0",)),
    "eval-no-checkpoints": Case(("eval", "{run}"), ("checkpoint",), lambda r: shutil.rmtree(r / "checkpoints")),
    # plot
    "plot-examples-negative": Case(("plot", "{run}", "--examples", "-1"), ("--examples",)),
    "plot-block-out-of-range": Case(("plot", "{run}", "--block", "7"), ("--block",)),
    "plot-out-is-a-file": Case(("plot", "{run}", "--out", "{file}"), ("--out",)),
    "plot-config-null": Case(("plot", "{run}"), ("config.json",), write("config.json", "null")),
    "plot-metrics-damaged": Case(("plot", "{run}"), ("metrics.jsonl", "line 1"), write("metrics.jsonl", "junk\n{}\n")),
    # the dispatcher
    "unknown-command": Case(("nope",), ("nope",)),
}  # fmt: skip


def tiny_config(out_dir: Path) -> TrainConfig:
    return TrainConfig(
        task=NthFarthestConfig(num_objects=4, num_features=4, test_size=8),
        rmc=RMCModelConfig(mem_slots=2, head_size=4, num_heads=1),
        head=HeadConfig((8,)),
        optim=OptimConfig(lr=1e-3),
        steps=20,
        batch_size=8,
        eval_every=10,
        eval_batch=8,
        log_every=5,
        checkpoint_every=10,
        device="cpu",
        out_dir=out_dir,
        run_name="run",
        tensorboard=False,
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny completed Nth Farthest run with checkpoints at steps 10 and 20."""
    out = tmp_path_factory.mktemp("trained")
    run(tiny_config(out), "nth-farthest")
    return out / "run"


def outcome(case: Case, trained: Path, tmp: Path, capsys) -> tuple[int, str, list[str]]:
    """``(exit status, stderr, the words to find)`` of the case's command on a fresh copy of
    ``trained``."""
    run_dir = tmp / "copy" / "run"
    shutil.copytree(trained, run_dir)
    (tmp / "empty").mkdir()
    (tmp / "empty" / "file").write_text("not a directory\n")
    if case.spoil is not None:
        case.spoil(run_dir)
    places = {
        "{run}": str(run_dir),
        "{tmp}": str(tmp / "empty"),
        "{file}": str(tmp / "empty" / "file"),
    }

    def fill(text: str) -> str:
        for key, value in places.items():
            text = text.replace(key, value)
        return text

    capsys.readouterr()
    code = cli.main([fill(a) for a in case.argv])
    return code, capsys.readouterr().err, [fill(n) for n in case.names]


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_gets_one_clear_line(name: str, trained: Path, tmp_path: Path, capsys) -> None:
    case = CASES[name]
    code, err, names = outcome(case, trained, tmp_path, capsys)
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    if not case.boxed:
        assert len(lines) == 1, err
    for word in names:
        assert word in err, f"{word!r} not in {err!r}"
