"""Learning smoke test (``docs/dnc.md`` §16.4): the DNC learns deepmind's repeat copy.

Opt in: -m slow."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from relmem.tasks.repeat_copy import repeat_copy_cpu
from relmem.train.loop import run
from relmem.train.metrics import read_metrics


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_dnc_learns_repeat_copy(tmp_path: Path) -> None:
    """The ``repeat-copy`` CPU preset (the DNC, Adam 1e-3, batch 16, one intra-op thread, as
    ``benchmarks/dnc_repeat_copy.py``) for its first 3000 steps through the trainer.

    The thread count changes the order of float reductions and so the trajectory; the preset
    fixes it at one. Its running time is in ``docs/results.md``.
    """
    config = repeat_copy_cpu()
    config.steps = 3000
    config.time_limit_min = None
    config.log_every = 200  # the last line's train/bit_errors covers steps 2801-3000
    config.eval_every = config.checkpoint_every = 3000
    config.device = "cpu"
    config.tensorboard = False
    config.out_dir, config.run_name = tmp_path, "learn"
    threads = torch.get_num_threads()
    try:
        result = run(config, "repeat-copy")
    finally:
        torch.set_num_threads(threads)
    assert result.status == "completed"
    last = [r for r in read_metrics(result.run_dir / "metrics.jsonl") if "train/loss" in r][-1]
    assert last["step"] == 3000
    # mean bit errors per sequence over the last 200 training steps; chance is about 5
    assert last["train/bit_errors"] < 0.1, last
