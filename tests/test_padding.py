"""Padding is inert: NaN or inf at padded steps changes no output and no gradient.

Every core and layer, and every registered model through its encoder and head, is run twice on
the same right-padded batch, once with zeros at the padded steps and once with NaN, +inf or
-inf there; the outputs, the final state and every parameter's gradient must be equal (the
gradient is of a loss over the valid steps only, as the trainer's). A product with a 0/1 mask
fails this (NaN * 0 is NaN); a selection passes.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

from relmem.cores import DNC, MemoryControllerLayer, RelationalMemory
from relmem.cores.base import map_state
from relmem.models import HeadConfig, get_model, list_models
from relmem.models import build_model as build_core_model
from relmem.models.lstm import LSTMCore
from relmem.tasks.base import TaskSpec

T, B, F = 5, 3, 4
LENGTHS = torch.tensor([5, 2, 3])
POISONS = [float("nan"), float("inf"), float("-inf")]
TINY_MODELS = {  # small settings of the registered models (others: their defaults)
    "rmc": {"mem_slots": 2, "head_size": 4, "num_heads": 2},
    "lstm": {"hidden_size": 8},
    "dnc": {"hidden_size": 8, "memory_size": 4, "word_size": 4},
    "convlstm": {"channels": 4},
}

CORES: dict[str, Callable[[], nn.Module]] = {
    "rmc-reference": lambda: RelationalMemory(
        F, 2, 4, 2, batch_first=True, implementation="reference"
    ),
    "rmc-fast": lambda: RelationalMemory(F, 2, 4, 2, batch_first=True, implementation="fast"),
    "lstm": lambda: LSTMCore(F, 6),
    "dnc": lambda: DNC(F, 6, memory_size=4, word_size=3, num_read_heads=2, batch_first=True),
    "mcl-gru": lambda: MemoryControllerLayer(F, 4, 3, 2, batch_first=True),
    "mcl-lstm-bidirectional": lambda: MemoryControllerLayer(
        F, 4, 3, 2, controller="lstm", bidirectional=True, batch_first=True
    ),
}


def valid_mask(steps: int) -> Tensor:
    """``[B, T, 1]`` True at the valid steps of :data:`LENGTHS`."""
    return (torch.arange(steps).unsqueeze(0) < LENGTHS.unsqueeze(1)).unsqueeze(-1)


def poisoned(inputs: Tensor, value: float) -> Tensor:
    """``inputs [B, T, ...]`` with ``value`` at every padded step."""
    mask = valid_mask(inputs.shape[1]).view(B, inputs.shape[1], *([1] * (inputs.dim() - 2)))
    return torch.where(mask, inputs, torch.full_like(inputs, value))


def run(module: nn.Module, inputs: Tensor) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    """Outputs, final-state leaves and parameter gradients of one forward and backward."""
    module.zero_grad(set_to_none=True)
    inputs = inputs.clone().requires_grad_(True)
    outputs, state = module(inputs, lengths=LENGTHS)
    leaves: list[Tensor] = []
    map_state(lambda t: leaves.append(t), state)
    mask = valid_mask(outputs.shape[1]) if outputs.dim() == 3 else torch.ones((), dtype=torch.bool)
    loss = torch.where(mask, outputs, 0.0).square().sum()
    loss = loss + sum(leaf.square().sum() for leaf in leaves)
    loss.backward()
    grads = [p.grad for p in module.parameters()]
    assert all(g is not None for g in grads)
    assert inputs.grad is not None and torch.isfinite(inputs.grad).all()
    return outputs.detach(), [t.detach() for t in leaves], grads


def assert_inert(module: nn.Module, inputs: Tensor) -> None:
    clean = run(module, poisoned(inputs, 0.0))
    for value in POISONS:
        dirty = run(module, poisoned(inputs, value))
        torch.testing.assert_close(dirty[0], clean[0], rtol=0, atol=0, msg=f"outputs, {value}")
        for got, want in zip(dirty[1] + dirty[2], clean[1] + clean[2], strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0, msg=f"state/grad, {value}")


@pytest.mark.parametrize("name", sorted(CORES))
def test_padding_is_inert_in_every_core(name: str) -> None:
    torch.manual_seed(0)
    module = CORES[name]()
    assert_inert(module, torch.randn(B, T, F))


def test_memory_controller_layer_outputs_zero_at_padded_steps() -> None:
    torch.manual_seed(0)
    layer = CORES["mcl-gru"]()
    outputs, _ = layer(poisoned(torch.randn(B, T, F), float("nan")), lengths=LENGTHS)
    padded = outputs[~valid_mask(T).expand_as(outputs)]
    assert padded.numel() == 5 * F and torch.equal(padded, torch.zeros_like(padded))


@pytest.mark.parametrize("output", ["last", "per_step"])
@pytest.mark.parametrize("name", list_models())
def test_padding_is_inert_in_every_model(name: str, output: str) -> None:
    spec = TaskSpec(input_size=F, seq_len=T, output_size=3, output=output)
    torch.manual_seed(0)
    config = get_model(name).config_cls(**TINY_MODELS.get(name, {}))
    model = build_core_model(name, config, HeadConfig((8,)), spec)
    assert_inert(model, torch.randn(B, T, F))


@pytest.mark.parametrize("name", sorted(CORES))
def test_the_state_after_lengths_is_each_example_run_alone(name: str) -> None:
    """Padding also stops the state: each example's final state is the one its valid prefix
    gives alone (the inertness checks above pass a loop that let padded steps update the state,
    as long as padding held zeros)."""
    torch.manual_seed(0)
    module = CORES[name]()
    inputs = torch.randn(B, T, F)
    with torch.no_grad():
        _, state = module(inputs, lengths=LENGTHS)
        for b, length in enumerate(LENGTHS.tolist()):
            _, alone = module(inputs[b : b + 1, :length])
            together = [leaf[b : b + 1] for leaf in state_leaves(state)]  # batch-leading
            for got, want in zip(together, state_leaves(alone), strict=True):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def state_leaves(state: object) -> list[Tensor]:
    """The tensors of a (nested) state, in order."""
    leaves: list[Tensor] = []
    map_state(leaves.append, state)
    return leaves
