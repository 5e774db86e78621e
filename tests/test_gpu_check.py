"""``scripts/gpu-check``'s dry run: every part on the CPU at toy sizes (issue 36), so that the
one prepared GPU call cannot fail on something a CPU would have shown."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SPEC = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(SPEC)
sys.modules["gpu_check"] = gpu_check  # dataclasses look their module up
SPEC.loader.exec_module(gpu_check)

# what the device tool brings back from $OUT: at most 8 files, names of these characters
ALLOWED = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, float]:
    out = tmp_path_factory.mktemp("out")
    env = {**os.environ, "RELMEM_PYTHON": sys.executable}
    start = time.monotonic()
    done = subprocess.run(
        [str(REPO / "scripts" / "gpu-check"), str(out), "--device", "cpu", "--tiny"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    seconds = time.monotonic() - start
    assert done.returncode == 0, done.stdout + done.stderr
    return out, json.loads((out / "summary.json").read_text()), seconds


def test_every_part_runs_on_the_cpu(dry_run: tuple[Path, dict, float]) -> None:
    out, summary, seconds = dry_run
    names = [part.name for part in gpu_check.parts()]
    assert list(summary["parts"]) == names
    assert {"env", "tests", "precision", "bench-compile"} <= set(names)
    assert {"bench-small", "bench-nth_farthest", "bench-wikitext2_port"} <= set(names)
    assert {f"paper-{t}" for t in ("nth-farthest", "lm-wt2-port", "lte", "boxworld")} <= set(names)
    for name, entry in summary["parts"].items():
        if name == "bench-lm_paper":  # its model alone takes half a CPU minute
            assert entry["status"] == "skipped", entry
            continue
        assert entry["status"] == "ok", (name, entry)
        assert "read_error" not in entry, (name, entry)
        assert entry["seconds"] <= entry["allowed_s"] <= entry["budget_s"]
    assert summary["seconds"] <= seconds


def test_summary_holds_each_parts_findings(dry_run: tuple[Path, dict, float]) -> None:
    _, summary, _ = dry_run
    parts = summary["parts"]
    assert parts["env"]["results"]["machine"]["torch"]
    assert parts["tests"]["results"]["failed"] == 0
    assert parts["tests"]["results"]["skipped"] > 0  # the CUDA tests, skipped on the CPU
    small = parts["bench-small"]["results"]["small"]
    assert {"reference", "fast", "matmul-floor", "best_rmc", "best_over_floor"} <= set(small)
    assert small["fast"]["fwd_bwd_ms"] > 0
    assert parts["bench-compile"]["results"]["small"]["fast+compile"]["fwd_bwd_ms"] > 0
    assert parts["precision"]["results"]["worst_gradient_error"]
    rates = {
        "paper-nth-farthest": "sequences_per_s",
        "paper-lm-wt2-port": "tokens_per_s",
        "paper-lte": "sequences_per_s",
        "paper-boxworld": "frames_per_s",
    }
    for name, rate in rates.items():
        found = parts[name]["results"]
        assert found["status"] == "completed" and found["steps"] == found["target_steps"]
        assert found[rate] > 0, (name, found)
        assert found[f"held_out_{found['metric']}"] is not None, (name, found)
    assert parts["paper-lm-wt2-port"]["results"]["corpus"] == "synthetic"


def test_what_comes_back_fits_the_device_tools_limits(dry_run: tuple[Path, dict, float]) -> None:
    out, _, _ = dry_run
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8 and all(p.parent == out for p in files), files
    assert all(set(p.name) <= ALLOWED for p in files), files
    assert all(p.stat().st_size < 16 * 2**20 for p in files)
    names = {p.name for p in files}
    assert {"summary.json", "log.txt", "bench.json", "runs.json", "junit.xml"} <= names
    runs = json.loads((out / "runs.json").read_text())
    assert {r["part"] for r in runs} == set(gpu_check.SLICES)


def test_every_bench_configuration_has_its_part() -> None:
    from relmem.benchmarking.configs import CONFIGS

    assert set(gpu_check.BENCH_CONFIGS) == set(CONFIGS)


def test_a_part_past_its_budget_is_stopped() -> None:
    start = time.monotonic()
    status, output = gpu_check._run_command(
        [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"],
        dict(os.environ),
        timeout=1.0,
    )
    assert status is None and "started" in output
    assert time.monotonic() - start < 15


def test_the_total_budget_skips_what_it_cannot_fit(tmp_path: Path) -> None:
    code = gpu_check.main(
        [str(tmp_path), "--device", "cpu", "--tiny", "--only", "env", "--total-budget", "1"]
    )
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["parts"] == {
        "env": {"status": "skipped", "reason": "the total budget of 1 s is spent"}
    }


def test_synthetic_corpus_has_the_vocabulary_asked_for(tmp_path: Path) -> None:
    folder = gpu_check.synthetic_corpus(tmp_path, 50, {"train": 400, "valid": 40, "test": 40})
    train = (folder / "wiki.train.tokens").read_text().split()
    assert len(train) == 400 and len(set(train)) == 50
    assert len((folder / "wiki.valid.tokens").read_text().split()) == 40


def test_a_bench_stopped_for_its_budget_keeps_the_rows_it_printed() -> None:
    output = "\n".join(
        [
            "# NVIDIA H100 | torch 2.11 | threads 16 | load [0.1]",
            "config          implementation       fwd ms   fwd+bwd ms      items/s",
            "lm_paper        reference            300.00       900.00         7111",
            "lm_paper        fast                 250.00       600.00        10667",
        ]
    )
    found = gpu_check._bench_rows(output)
    assert found["partial"] and set(found["lm_paper"]) >= {"reference", "fast", "best_rmc"}
    assert found["lm_paper"]["fast"]["fwd_bwd_ms"] == 600.0
    assert found["lm_paper"]["best_rmc"] == "fast"


def test_the_gpu_runs_commands_parse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The full-size commands, which only a GPU session runs, parse here (the dry run's are
    toy-sized: a renamed option would otherwise first fail on the one GPU call)."""
    from relmem.commands import bench, train

    monkeypatch.setattr(gpu_check, "_lm_corpus", lambda ctx: tmp_path)  # no 2M-token corpus
    ctx = gpu_check.Context(tmp_path, tmp_path, "cuda", tiny=False)
    parsed = []
    for part in gpu_check.parts():
        argv = part.command(ctx)
        if argv[1:4] == ["-m", "relmem", "bench"]:
            args = bench.parse(argv[4:])
            assert args.device == "cuda" and args.repeat >= 5, part.name
        elif argv[1:4] == ["-m", "relmem", "train"]:
            _, config, _ = train.parse(argv[4:])
            assert config.device == "cuda" and config.steps == config.eval_every, part.name
        elif part.name == "tests":
            assert argv[-1] == "tests" and argv[argv.index("-m", 2) + 1] == "gpu"
        else:
            continue
        parsed.append(part.name)
    assert len(parsed) == len(gpu_check.BENCH_CONFIGS) + 1 + len(gpu_check.SLICES) + 1
