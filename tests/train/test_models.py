"""Every registered model on a last-step and a per-step task, and every preset: shapes,
gradients, one step moves every weight, padding changes nothing."""

from __future__ import annotations

import pytest
import torch

from relmem.models import HeadConfig, count_parameters, get_model, list_models
from relmem.models import build_model as build_core_model
from relmem.tasks import NthFarthest, NthFarthestConfig, RepeatCopyConfig, get_preset, get_task
from relmem.tasks.base import TaskSpec, step_generator
from relmem.train.runs import build_model

TINY_CONFIGS = {
    "rmc": {"mem_slots": 2, "head_size": 4, "num_heads": 2},
    "lstm": {"hidden_size": 8},
    "dnc": {"hidden_size": 8, "num_layers": 2, "memory_size": 4, "word_size": 4},
}


def test_registry_lists_the_models() -> None:
    assert {"rmc", "lstm", "dnc"} <= set(list_models())
    with pytest.raises(KeyError, match="known models"):
        get_model("nope")


def tiny_model(name: str, spec: TaskSpec) -> torch.nn.Module:
    config = get_model(name).config_cls(**TINY_CONFIGS.get(name, {}))
    torch.manual_seed(0)
    return build_core_model(name, config, HeadConfig((8,)), spec)


TASKS = {
    "nth-farthest": NthFarthestConfig(num_objects=4, num_features=3, test_size=8),
    "repeat-copy": RepeatCopyConfig(test_size=8),
}


@pytest.mark.parametrize("task_name", sorted(TASKS))
@pytest.mark.parametrize("name", list_models())
def test_forward_backward_every_parameter(name: str, task_name: str) -> None:
    task = get_task(task_name).build(TASKS[task_name])
    model = tiny_model(name, task.spec)
    batch = task.sample(5, step_generator(torch.device("cpu"), 0))
    logits, _ = model(batch.inputs, lengths=batch.lengths)
    expected = batch.targets.shape if task.spec.per_step else (5, 4)
    assert logits.shape == expected and torch.isfinite(logits).all()
    before = [p.detach().clone() for p in model.parameters()]
    task.loss(logits, batch).backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"{name}: no gradient for {pname}"
    torch.optim.Adam(model.parameters(), lr=1e-3).step()
    for (pname, p), old in zip(model.named_parameters(), before, strict=True):
        assert not torch.equal(p, old), f"{name}: {pname} did not change"


@pytest.mark.parametrize("output", ["last", "per_step"])
@pytest.mark.parametrize("name", list_models())
def test_padding_changes_nothing(name: str, output: str) -> None:
    """With ``lengths``, example b's logits equal those of its unpadded prefix run alone."""
    spec = TaskSpec(input_size=5, seq_len=6, output_size=3, output=output)
    model = tiny_model(name, spec).eval()
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(4, 6, 5, generator=generator)  # the padding is noise, not zeros
    lengths = torch.tensor([6, 2, 4, 1])
    logits, _ = model(inputs, lengths=lengths)
    for b, steps in enumerate(lengths.tolist()):
        alone = model(inputs[b : b + 1, :steps])[0][0]
        got = logits[b, :steps] if spec.per_step else logits[b]
        torch.testing.assert_close(got, alone, msg=f"{name}, example {b}")


def test_paper_preset_matches_spec() -> None:
    config = get_preset("nth-farthest", "paper")
    assert (config.task.num_objects, config.task.num_features, config.task.test_size) == (
        8,
        16,
        16000,
    )
    assert (config.batch_size, config.optim.lr, config.optim.grad_clip) == (1600, 1e-4, None)
    assert config.head.hidden_sizes == (256, 256, 256, 256)
    model = build_model(config, NthFarthest(config.task))
    assert count_parameters(model.core) == 605_184  # `docs/tasks.md` §1.3
    assert model.core.config.mem_size == 256
