"""``benchmarks/round_table.py``: the kept files of a round and its table (the figures of
``docs/results.md``'s quiet rounds come from it)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SPEC = importlib.util.spec_from_file_location("round_table", REPO / "benchmarks" / "round_table.py")
round_table = importlib.util.module_from_spec(SPEC)
sys.modules["round_table"] = round_table
SPEC.loader.exec_module(round_table)


def _run(folder: Path, model: str, seed: int, evaluations: dict[int, float], test: float) -> Path:
    """A run directory as ``relmem train lm`` and ``relmem eval`` leave it, its last
    evaluation at its last step."""
    folder.mkdir(parents=True)
    steps = max(evaluations)
    (folder / "config.json").write_text(json.dumps({"seed": seed, "task": {"bptt": 50}}))
    (folder / "run.json").write_text("{}")
    lines = [{"step": s, "train/loss": 5.0} for s in range(50, steps + 1, 50)]
    lines += [{"step": s, "eval/perplexity": v} for s, v in evaluations.items()]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    summary = {"model": model, "parameters": 1000, "steps": steps, "wall_time_s": 600.0,
               "sequences_seen": 32 * steps, "metric": "perplexity",
               "held_out_perplexity": evaluations[steps]}  # fmt: skip
    (folder / "summary.json").write_text(json.dumps(summary))
    best = min(evaluations.values())
    record = {"perplexity": best, "more_held_out": {"test": {"perplexity": test}}}
    (folder / "eval.json").write_text(json.dumps(record))
    return folder


def test_keep_and_table(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    fast = _run(runs / "lstm-seed0", "lstm", 0, {500: 390.0, 1000: 300.0, 1200: 290.0}, 280.0)
    slow = _run(runs / "rmc-seed0", "rmc", 0, {500: 330.0, 1000: 310.0, 1100: 305.0}, 301.0)
    (runs / "load-lstm-seed0.log").write_text("04:00:00 1.00 0.9 0.8\n04:00:15 1.25 1.0 0.9\n")
    (runs / "load-rmc-seed0.log").write_text("04:10:00 0.50 0.9 0.8\n")
    kept = tmp_path / "kept"
    for run in (fast, slow):
        round_table.keep(run, kept / run.name, runs / f"load-{run.name}.log")
    assert (kept / "rmc-seed0" / "load.log").is_file()
    rows = round_table.table(kept).splitlines()
    assert "tokens/s" in rows[0] and "perplexity at step 1,000" in rows[0]  # the last common one
    assert "test, relmem eval" in rows[0] and "solved" not in rows[0]
    lstm, rmc = rows[2].split(" | "), rows[3].split(" | ")
    assert lstm[4:8] == ["1,200", "10.0 min", f"{32 * 1200 * 50 / 600:,.0f}", "1.00-1.25"]
    assert lstm[8:] == ["290.0", "290.0", "280.0", "300.0 |"]
    assert rmc[4] == "1,100" and rmc[7] == "0.50-0.50" and rmc[-1] == "310.0 |"


def test_table_of_rl_runs(tmp_path: Path) -> None:
    """An RL run: frames per second, and ``relmem eval``'s agent return on the test levels."""
    run = tmp_path / "rmc-seed1"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"seed": 1, "task": {"unroll": 40}}))
    lines = [{"step": 50, "eval/return": 20.0}, {"step": 100, "eval/return": 31.5}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    summary = {"model": "rmc", "parameters": 62398, "steps": 100, "wall_time_s": 120.0,
               "sequences_seen": 6400, "frames_seen": 256000, "metric": "return",
               "held_out_return": 31.5}  # fmt: skip
    (run / "summary.json").write_text(json.dumps(summary))
    record = {"step": 100, "agent": {"return": 30.26}, "random": {"return": 9.2}}
    (run / "eval.json").write_text(json.dumps(record))
    rows = round_table.table(tmp_path).splitlines()
    assert "frames/s" in rows[0] and "return at step 100" in rows[0]
    cells = rows[2].split(" | ")
    assert cells[6:] == [f"{256000 / 120:,.0f}", "not recorded", "31.5", "30.3 (100)", "31.5 |"]
