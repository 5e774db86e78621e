"""Models as ``encoder -> core -> head``: every core with every head, state in and out,
token encodings, folding a linear head into the DNC, and loading older checkpoints' names."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from relmem.cores.base import detach_state
from relmem.models import (
    CoreReadout,
    HeadConfig,
    SequenceModel,
    TaskSpec,
    build_model,
    get_model,
    list_models,
)
from relmem.models.heads import _HEADS
from relmem.train.config import TrainConfig

TINY = {
    "rmc": {"mem_slots": 2, "head_size": 4, "num_heads": 2},
    "lstm": {"hidden_size": 8, "num_layers": 2},
    "dnc": {"hidden_size": 8, "memory_size": 4, "word_size": 4, "num_read_heads": 2},
    "convlstm": {"channels": 4},
}


def tiny(name: str, spec: TaskSpec) -> SequenceModel:
    torch.manual_seed(0)
    config = get_model(name).config_cls(**TINY.get(name, {}))
    return build_model(name, config, HeadConfig((8,)), spec)


def spec_for(head: str, encoding: str = "features") -> TaskSpec:
    return TaskSpec(
        input_size=5, seq_len=6, output_size=3, output=head, encoding=encoding, embedding_size=4
    )


def inputs_for(spec: TaskSpec, batch: int = 4) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    if spec.encoding == "features":
        return torch.randn(batch, spec.seq_len, spec.input_size, generator=generator)
    return torch.randint(0, spec.input_size, (batch, spec.seq_len), generator=generator)


@pytest.mark.parametrize("encoding", ["features", "one_hot", "embedding"])
@pytest.mark.parametrize("head", sorted(_HEADS))
@pytest.mark.parametrize("name", list_models())
def test_every_core_with_every_head_and_encoding(name: str, head: str, encoding: str) -> None:
    spec = spec_for(head, encoding)
    model = tiny(name, spec)
    lengths = torch.tensor([6, 3, 1, 5])
    logits, state = model(inputs_for(spec), lengths=lengths)
    expected = (4, 6, 3) if spec.per_step else (4, 3)
    assert logits.shape == expected and torch.isfinite(logits).all()
    loss = logits.square().mean() + sum(t.sum() for t in _leaves(state)) * 0
    loss.backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, f"{name}/{head}/{encoding}: no gradient for {pname}"


@pytest.mark.parametrize("head", sorted(_HEADS))
@pytest.mark.parametrize("name", list_models())
def test_state_carried_equals_one_long_sequence(name: str, head: str) -> None:
    """Two windows with the state carried give the per-step outputs of one long sequence."""
    spec = spec_for("per_step")
    model = tiny(name, spec).eval()
    x = inputs_for(spec)
    whole, whole_state = model(x)
    first, state = model(x[:, :2])
    second, final = model(x[:, 2:], detach_state(state))
    torch.testing.assert_close(torch.cat([first, second], 1), whole)
    for got, want in zip(_leaves(final), _leaves(whole_state), strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("name", list_models())
def test_initial_state_is_the_default(name: str) -> None:
    spec = spec_for("last")
    model = tiny(name, spec).eval()
    x = inputs_for(spec)
    torch.testing.assert_close(model(x)[0], model(x, model.initial_state(4))[0])
    for leaf in _leaves(model.initial_state(4)):
        assert leaf.shape[0] == 4, "states are batch-leading"


def test_a_linear_head_is_folded_into_the_dnc_output_layer() -> None:
    model = tiny("dnc", spec_for("per_step"))
    assert isinstance(model.head, CoreReadout) and model.core.output_size == 3
    assert not isinstance(tiny("dnc", spec_for("last")).head, CoreReadout)
    assert not isinstance(tiny("rmc", spec_for("per_step")).head, CoreReadout)


def test_older_checkpoints_per_step_readout_names_load() -> None:
    """Per-step RMC and LSTM models used to call their linear head ``readout``."""
    model = tiny("rmc", spec_for("per_step"))
    legacy = {
        k.replace("head.", "readout.", 1) if k.startswith("head.") else k: v.clone() + 1
        for k, v in model.state_dict().items()
    }
    assert "readout.weight" in legacy
    model.load_state_dict(legacy, strict=True)
    torch.testing.assert_close(model.head.weight, legacy["readout.weight"])


def test_a_config_of_another_model_is_refused() -> None:
    with pytest.raises(TypeError, match="model 'lstm' takes a LSTMModelConfig, got RMCModelConfig"):
        build_model("lstm", get_model("rmc").config_cls(), HeadConfig(), spec_for("last"))


def test_unknown_head_and_encoding_are_named() -> None:
    with pytest.raises(
        KeyError, match="unknown head 'tied'; known heads: last, lm_softmax, per_step"
    ):
        tiny("lstm", spec_for("tied"))
    with pytest.raises(KeyError, match="unknown encoding 'bytes'"):
        tiny("lstm", spec_for("last", "bytes"))


def test_train_config_has_a_field_per_registered_model() -> None:
    fields = {f.name: f.type for f in dataclasses.fields(TrainConfig)}
    for name in list_models():
        assert fields[name] is get_model(name).config_cls


def _leaves(state: object) -> list[torch.Tensor]:
    if state is None:
        return []
    if isinstance(state, torch.Tensor):
        return [state]
    return [leaf for part in state for leaf in _leaves(part)]  # type: ignore[attr-defined]
