"""The reading tests' sample: SQuAD-layout files written for them (tests/data/squad), copied
into each test's folder so caches land there."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "squad"


@pytest.fixture
def squad_dir(tmp_path: Path) -> Path:
    """A folder holding the v1.1 sample as train and dev file, and the v2.0 sample."""
    folder = tmp_path / "squad"
    folder.mkdir()
    shutil.copy(SAMPLE / "sample-v1.1.json", folder / "train-v1.1.json")
    shutil.copy(SAMPLE / "sample-v1.1.json", folder / "dev-v1.1.json")
    shutil.copy(SAMPLE / "sample-v2.0.json", folder / "sample-v2.0.json")
    return folder
