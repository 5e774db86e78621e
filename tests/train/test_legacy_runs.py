"""Run directories written before the redesign (``tests/data/legacy_runs``) still evaluate to
the figures their own run recorded, and resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from relmem import cli
from relmem.train.metrics import read_metrics

LEGACY = Path(__file__).resolve().parents[1] / "data" / "legacy_runs"
RUNS = {"nth-farthest-rmc": "accuracy", "repeat-copy-rmc": "bit_errors"}


@pytest.fixture
def legacy_run(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """A copy of one legacy run directory (they are read-only data)."""
    run = tmp_path / request.param
    shutil.copytree(LEGACY / request.param, run)
    return run


@pytest.mark.parametrize("legacy_run", sorted(RUNS), indirect=True)
def test_a_legacy_run_evaluates_to_its_recorded_figures(legacy_run: Path) -> None:
    metric = RUNS[legacy_run.name]
    recorded = json.loads((legacy_run / "summary.json").read_text())
    out = legacy_run / "eval-now.json"
    assert cli.main(["eval", str(legacy_run), "--device", "cpu", "--json-out", str(out)]) == 0
    now = json.loads(out.read_text())
    assert now["step"] == recorded["held_out_step"] == 20
    assert now[metric] == recorded[f"held_out_{metric}"]
    # the loss is now reduced from per-example sums: equal to float32 rounding
    assert now["loss"] == pytest.approx(recorded["held_out_loss"], rel=1e-6)


@pytest.mark.parametrize("legacy_run", sorted(RUNS), indirect=True)
def test_a_legacy_run_resumes(legacy_run: Path) -> None:
    task = legacy_run.name.rsplit("-", 1)[0]
    assert cli.main(["train", task, "--resume", str(legacy_run), "--steps", "30"]) == 0
    steps = [record["step"] for record in read_metrics(legacy_run / "metrics.jsonl")]
    assert steps[-1] == 30 and steps == sorted(steps)
    assert json.loads((legacy_run / "summary.json").read_text())["steps"] == 30
