"""``docs/extending.md`` is runnable: its GRU core and majority task, run as written, register
themselves, and the trainer learns the task with the new core."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
SRC = DOC.parents[1] / "src"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_guide_has_a_core_and_a_task() -> None:
    core, task = python_blocks()
    assert '@register_model("gru"' in core and '@register_task("majority"' in task


@pytest.mark.timeout(300)
def test_the_guides_core_learns_the_guides_task(tmp_path: Path) -> None:
    """In a fresh process (the registries are global): the two blocks, then a short run of the
    majority preset with ``--model gru``, which must clearly beat chance (50%)."""
    core, task = python_blocks()
    script = textwrap.dedent(
        f"""
        import json, sys
        from pathlib import Path
        import torch
        torch.set_num_threads(1)
        exec({core!r}, {{"__name__": "doc_gru"}})
        exec({task!r}, {{"__name__": "doc_majority"}})
        from relmem.tasks import get_preset
        from relmem.train.loop import run
        config = get_preset("majority", "cpu")
        config.model = "gru"
        config.steps = 400
        config.device = "cpu"
        config.out_dir = Path(sys.argv[1])
        config.run_name = "majority-gru"
        result = run(config, "majority")
        print(json.dumps(result.summary))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
        timeout=280,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["model"] == "gru" and summary["status"] == "completed"
    assert summary["held_out_accuracy"] > 0.9, summary
