"""The RL tasks' presets (``docs/rl.md`` §4.5): each builds its game and an agent with every
core, the defaults are ``cpu``, and the ``paper`` presets follow spec §3."""

from __future__ import annotations

import pytest
import torch

from relmem.models import count_parameters
from relmem.rl.tasks import build_boxworld  # noqa: F401  (registers the RL tasks)
from relmem.tasks.registry import default_preset, get_preset, get_task, list_presets

RL_TASKS = ("boxworld", "minipacman")
PRESETS = [(task, entry.name) for task in RL_TASKS for entry in list_presets(task)]


@pytest.mark.parametrize(("task_name", "preset"), PRESETS, ids=[f"{t}-{p}" for t, p in PRESETS])
@pytest.mark.parametrize("model", ["rmc", "lstm", "convlstm"])
def test_presets_build_every_core(task_name: str, preset: str, model: str) -> None:
    config = get_preset(task_name, preset)
    task = get_task(task_name).build(config.task)
    with torch.device("meta"):
        agent = task.agent(model, getattr(config, model))
    assert count_parameters(agent) > 0


def test_defaults_and_the_paper_setting() -> None:
    for task_name in RL_TASKS:
        assert default_preset(task_name).name == "cpu"
        paper = get_preset(task_name, "paper")
        assert paper.task.algorithm == "impala" and paper.task.unroll == 40
        assert paper.task.entropy_coeff == 0.005 and paper.task.gamma == 0.99
        # IMPALA's TF RMSProp on losses summed over K = B·T steps, translated to mean losses
        # (tests/train/test_optimizers.py checks the updates)
        k = 32 * 40
        assert paper.optim.optimizer == "rmsprop-tf" and paper.optim.alpha == 0.99
        assert paper.optim.eps == pytest.approx(0.01 / k**2)
        assert paper.optim.initial_mean_square == pytest.approx(1 / k**2)
        assert paper.optim.grad_clip == pytest.approx(40.0 / k)
        assert paper.batch_size * paper.task.unroll * paper.steps == 10**9
    box_preset = get_preset("boxworld", "cpu")
    box = box_preset.task
    assert (box.grid_size, box.solution_length, box.num_forward) == (6, 1, 0)
    assert box.observation == "full"
    for task_name in RL_TASKS:  # the rate decays over the steps the VM makes in 20 minutes
        cpu = get_preset(task_name, "cpu")
        assert (cpu.optim.schedule, cpu.optim.lr, cpu.optim.min_lr) == ("cosine", 1e-3, 8e-5)
        assert (cpu.steps, cpu.time_limit_min) == (600, 20.0)


def test_the_agent_options_reach_the_agent_and_head_options_are_refused() -> None:
    """``--task.agent.*`` shapes the encoder and the heads; ``--head.*`` (the supervised
    tasks' MLP head) was accepted and ignored by RL runs, and is now refused with the way out."""
    from relmem.commands.train import parse
    from relmem.rl.runs import agent_of

    argv = ["boxworld", "--task.agent.hidden-size", "24", "--task.agent.conv-channels", "5"]
    task_name, config, _ = parse(argv)
    task = get_task(task_name).build(config.task)
    with torch.device("meta"):
        agent = agent_of(config, task)
    shapes = {name: tuple(p.shape) for name, p in agent.named_parameters()}
    assert any(shape[:1] == (24,) for name, shape in shapes.items() if name.startswith("trunk"))
    assert any(shape[:1] == (5,) for name, shape in shapes.items() if name.startswith("encoder"))
    assert not any(shape[:1] == (256,) for name, shape in shapes.items() if "trunk" in name)
    _, config, _ = parse(["boxworld", "--head.hidden-sizes", "8"])
    with pytest.raises(ValueError, match="--head.*--task.agent.hidden-size"):
        agent_of(config, task)


def test_learner_options_that_would_be_ignored_are_refused(tmp_path, capsys) -> None:
    """--task.backend under PPO, and more PPO minibatches than trajectories, were accepted and
    ignored (PPO collects in-process; chunking gave fewer minibatches)."""
    from relmem import cli

    argv = ["train", "boxworld", "--out-dir", str(tmp_path), "--steps", "1"]
    assert cli.main([*argv, "--task.backend", "ray"]) == 2
    assert "PPO collects in this" in " ".join(capsys.readouterr().err.split())  # boxed
    assert cli.main([*argv, "--task.minibatches", "9", "--batch-size", "8"]) == 2
    assert "at most 8 minibatches" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("task_name", RL_TASKS)
def test_the_default_presets_warn_nothing(task_name: str, monkeypatch) -> None:
    """The first command of the RL family, ``relmem train boxworld``, warned on every run that
    its own preset drew levels a 6x6 room cannot hold (``UnreachableDrawWarning``): a default
    that warns about itself teaches users to ignore warnings."""
    import warnings

    from relmem.rl.envs import boxworld

    monkeypatch.setattr(boxworld, "_ISSUED", set())  # each message shows once per process
    config = get_preset(task_name, default_preset(task_name).name)
    with warnings.catch_warnings():
        warnings.simplefilter("error", boxworld.UnreachableDrawWarning)
        get_task(task_name).build(config.task)  # builds a probe environment
