"""The reading presets build every reader on the sample (the paper's without its GloVe file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from relmem.models import count_parameters, list_models
from relmem.tasks import get_preset, get_task
from relmem.train.runs import build_model


@pytest.mark.parametrize("preset", ["cpu", "paper"])
def test_presets_build_every_reader(squad_dir: Path, preset: str) -> None:
    config = get_preset("squad", preset)
    assert config.model == "dnc"
    config.task.data_dir, config.task.embeddings = squad_dir, None
    task = get_task("squad").build(config.task)
    sizes = {}
    for name in ["none", *list_models()]:
        if name == "convlstm":  # a spatial core: the reader's document is a sequence
            continue
        config.model = name
        sizes[name] = count_parameters(build_model(config, task))
    assert sizes["none"] < min(v for k, v in sizes.items() if k != "none")


def test_the_paper_preset_names_glove(squad_dir: Path) -> None:
    config = get_preset("squad", "paper")
    assert config.task.embeddings is not None and config.task.embeddings.name.startswith("glove")
    assert config.task.word_size == 300


def test_none_is_the_readers_only(squad_dir: Path) -> None:
    config = get_preset("nth-farthest", "cpu")
    config.model = "none"
    task = get_task("nth-farthest").build(config.task)
    with pytest.raises(ValueError, match="--model none is a choice of the reader"):
        build_model(config, task)
