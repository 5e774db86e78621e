"""Presets register themselves next to their task: each builds every model, each task has its
default, and ``get_preset`` takes the CLI name or the library name of the task's own presets."""

from __future__ import annotations

import pytest

from relmem.models import count_parameters, list_models
from relmem.tasks import get_preset, get_task, list_presets, list_tasks
from relmem.tasks.registry import default_preset
from relmem.train.runs import build_model

LIBRARY_TASKS = {"nth-farthest", "repeat-copy", "copy", "associative-recall", "lte", "lm", "squad"}
RL_TASKS = {"boxworld", "minipacman"}
DATA_TASKS = {"lm", "squad"}  # need data: tests/tasks/test_language_model.py and
# tests/reading/test_reading_presets.py build their presets
PRESETS = [
    (task, entry.library_name)
    for task in sorted(LIBRARY_TASKS - DATA_TASKS)
    for entry in list_presets(task)
]


@pytest.mark.parametrize(("task_name", "preset"), PRESETS, ids=[p for _, p in PRESETS])
def test_presets_build(task_name: str, preset: str) -> None:
    config = get_preset(task_name, preset)
    task = get_task(task_name).build(config.task)
    for model_name in list_models():
        config.model = model_name
        assert count_parameters(build_model(config, task)) > 0


def test_every_task_has_its_default_preset_and_refuses_others() -> None:
    # the RL tasks are registered once relmem.commands or relmem.rl.tasks is imported; their
    # presets are tested in tests/rl/test_rl_presets.py
    with_presets = {name for name in list_tasks() if list_presets(name)} - RL_TASKS
    assert with_presets == LIBRARY_TASKS <= set(list_tasks())
    for name in LIBRARY_TASKS:
        entry = default_preset(name)
        assert entry.task == name and entry.name == "cpu"
        assert list_presets(name)[0] is entry
        assert get_preset(name, "cpu") == get_preset(name, entry.library_name)
    with pytest.raises(KeyError, match="unknown preset 'nth_farthest_cpu' for task 'copy'"):
        get_preset("copy", "nth_farthest_cpu")


def test_cli_and_library_names() -> None:
    names = {(e.name, e.library_name) for e in list_presets("nth-farthest")}
    assert names == {
        ("cpu", "nth_farthest_cpu"),
        ("paper", "nth_farthest_paper"),
        ("dnc-cpu", "nth_farthest_dnc_cpu"),
        ("dnc-paper", "nth_farthest_dnc_paper"),
    }
    assert get_preset("nth-farthest", "dnc-paper").model == "dnc"
