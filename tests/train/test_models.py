"""Every registered model and every preset: shapes, gradients, one step moves every weight."""

from __future__ import annotations

import pytest
import torch

from relmem.models import HeadConfig, count_parameters, get_model, list_models
from relmem.presets import LIBRARY_NAMES, PRESETS, TASK_OF, get_preset
from relmem.tasks import NthFarthest, NthFarthestConfig
from relmem.tasks.base import get_task, list_tasks, step_generator
from relmem.train.loop import build_model

TINY_CONFIGS = {
    "rmc": {"mem_slots": 2, "head_size": 4, "num_heads": 2},
    "lstm": {"hidden_size": 8},
    "dnc": {"hidden_size": 8, "num_layers": 2, "memory_size": 4, "word_size": 4},
}


def test_registry_lists_the_models() -> None:
    assert {"rmc", "lstm", "dnc"} <= set(list_models())
    with pytest.raises(KeyError, match="known models"):
        get_model("nope")


@pytest.mark.parametrize("name", list_models())
def test_forward_backward_every_parameter(name: str) -> None:
    task = NthFarthest(NthFarthestConfig(num_objects=4, num_features=3, test_size=8))
    entry = get_model(name)
    torch.manual_seed(0)
    model = entry.build(entry.config_cls(**TINY_CONFIGS.get(name, {})), HeadConfig((8,)), task.spec)
    batch = task.sample(5, step_generator(torch.device("cpu"), 0))
    logits = model(batch.inputs)
    assert logits.shape == (5, 4) and torch.isfinite(logits).all()
    before = [p.detach().clone() for p in model.parameters()]
    task.loss(logits, batch).backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"{name}: no gradient for {pname}"
    torch.optim.Adam(model.parameters(), lr=1e-3).step()
    for (pname, p), old in zip(model.named_parameters(), before, strict=True):
        assert not torch.equal(p, old), f"{name}: {pname} did not change"


@pytest.mark.parametrize("preset", sorted(LIBRARY_NAMES))
def test_presets_build(preset: str) -> None:
    task_name = TASK_OF[preset]
    config = get_preset(task_name, preset)
    task = get_task(task_name).build(config.task)
    for model_name in list_models():
        config.model = model_name
        assert count_parameters(build_model(config, task)) > 0


def test_every_task_has_its_default_preset_and_refuses_others() -> None:
    for name in list_tasks():
        entry = get_task(name)
        assert TASK_OF[entry.default_preset] == name
        assert PRESETS[name]["cpu"] is LIBRARY_NAMES[entry.default_preset]
    with pytest.raises(KeyError, match="unknown preset 'nth_farthest_cpu' for task 'copy'"):
        get_preset("copy", "nth_farthest_cpu")


def test_paper_preset_matches_spec() -> None:
    config = PRESETS["nth-farthest"]["paper"]()
    assert (config.task.num_objects, config.task.num_features, config.task.test_size) == (
        8,
        16,
        16000,
    )
    assert (config.batch_size, config.optim.lr, config.optim.grad_clip) == (1600, 1e-4, None)
    assert config.head.hidden_sizes == (256, 256, 256, 256)
    model = build_model(config, NthFarthest(config.task))
    assert count_parameters(model.core) == 605_184  # spec 1.3
    assert model.core.config.mem_size == 256
