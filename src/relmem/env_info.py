"""Where a result came from: the git commit and the machine, recorded with every run and bench.

One place answers "which code, which machine" so that ``run.json``, the bench's JSON files and
the benchmark scripts record the same fields the same way.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

_PACKAGE_DIR = Path(__file__).resolve().parent


def git_sha() -> str | None:
    """The commit of the relmem source tree in use, or None outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=_PACKAGE_DIR,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def cpu_name() -> str:
    """The processor's model name (``/proc/cpuinfo``), or what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as handle:
            names = [line.split(":", 1)[1].strip() for line in handle if "model name" in line]
    except OSError:
        names = []
    return names[0] if names else (platform.processor() or platform.machine())


def device_name(device: torch.device) -> str:
    """The GPU's name for a CUDA device, the CPU's otherwise."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name()


def machine_info(device: torch.device) -> dict[str, Any]:
    """Device, software, load and commit, as recorded with every benchmark result."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "git_sha": git_sha(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            gpu=props.name,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            multiprocessors=props.multi_processor_count,
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
            driver=_nvidia_driver(),
        )
    return info


def _nvidia_driver() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None
