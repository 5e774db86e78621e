"""Running training in child processes: one, or several under ``torchrun`` (gloo on the CPU)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node"]


def run_python(args: list[str], *, processes: int = 1, timeout: int) -> subprocess.CompletedProcess:
    """``python ARGS`` (``-m relmem ...`` or a script), alone or as ``processes`` torchrun
    ranks, with ``src`` on the path and one intra-op thread each; output captured as text."""
    launcher = [sys.executable] if processes == 1 else [*TORCHRUN, str(processes)]
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [*launcher, *args], env=env, capture_output=True, text=True, timeout=timeout
    )
