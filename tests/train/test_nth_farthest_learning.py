"""The RMC leaves the Nth Farthest plateau (``docs/tasks.md`` §1.5) on a CPU. Opt in: ``-m slow``.

The default CPU preset's settings (Adam 2e-4, clip 1, batch 256, the small RMC) on the smallest
relational variant, K=3 objects of F=2 dims, where the trivial plateau is 2/3: a model that
never compares distances cannot pass (its running time: ``docs/results.md``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from relmem.tasks.nth_farthest import NthFarthestConfig, nth_farthest_cpu
from relmem.train.loop import run


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_rmc_leaves_the_plateau(tmp_path: Path) -> None:
    config = nth_farthest_cpu()
    config.cpu_threads = 1  # which run() sets for the process; 'auto' is not bit-reproducible
    config.task = NthFarthestConfig(num_objects=3, num_features=2, test_size=3000)
    config.steps = 4000
    config.time_limit_min = None
    config.device = "cpu"
    config.tensorboard = False
    config.out_dir = tmp_path
    config.run_name = "learn"

    threads = torch.get_num_threads()
    try:
        result = run(config, "nth-farthest")
    finally:
        torch.set_num_threads(threads)

    assert result.status == "completed"
    accuracy = result.summary["held_out_accuracy"]
    assert accuracy > 0.8, f"held-out accuracy {accuracy:.3f}; the plateau is 2/3"
    last_eval = [
        json.loads(line)
        for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()
        if "eval/accuracy_group_1" in line
    ][-1]
    for rank in (1, 2):  # the nearest and the farthest other object: relational answers
        assert last_eval[f"eval/accuracy_group_{rank}"] > 0.7, last_eval
