"""Building and loading the library's C++ operators (the RMC's and the DNC's fused steps).

Each operator library is one C++ source compiled on first use with ``torch.utils.cpp_extension``
(a C++ compiler and ``ninja`` are needed) and cached under torch's extensions root
(``TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``), one folder per library, Python and
torch version and installation (:func:`build_directory`). Builds are serialised across processes
by an flock, and a build killed half-way is rebuilt, not waited for or loaded.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import warnings
from pathlib import Path

import torch
from filelock import FileLock

# The build's own lock, held while torch checks and (re)builds the operators: an flock, which
# the kernel drops when its process ends however it ends.
BUILD_LOCK = "relmem-build.lock"
# torch's lock in the build folder: a file that only the process that made it removes. A build
# killed while compiling (Ctrl-C, SIGKILL: the first training run on a machine compiles for
# about 25 s before it has a run directory) leaves it, and every later load waits for it
# forever, silently.
TORCH_LOCK = "lock"


_SAID: set[str] = set()


def warn_once(message: str, stacklevel: int) -> None:
    """``warnings.warn(message)`` the first time this process says ``message``, then never
    again: a fused step that falls back says why once, not at every call. ``stacklevel``
    counts from the caller of this function, as it would for ``warnings.warn`` there."""
    if message in _SAID:
        return
    _SAID.add(message)
    warnings.warn(message, stacklevel=stacklevel + 1)


def build_directory(name: str, source: Path) -> Path:
    """Where library ``name`` is built and cached: under torch's extensions root, a folder per
    Python version, torch version (torch's own cache keys on the sources and flags, not on its
    version) and installation (the source file's absolute path)."""
    from torch.utils import cpp_extension

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()
    version = f"py{sys.version_info.major}{sys.version_info.minor}-torch{torch.__version__}"
    # and per installation: the build records its source's absolute path, so that two
    # installations sharing a folder would rebuild over each other
    where = hashlib.sha1(str(source.resolve()).encode()).hexdigest()[:8]
    return Path(root) / f"{name}-{version}-{where}"


def put_ninja_on_path() -> None:
    """Let torch find the ``ninja`` package's binary, which sits beside the Python that runs
    relmem (``.venv/bin``): torch looks for ``ninja`` on ``PATH`` alone, and a virtual
    environment used without being activated (``.venv/bin/relmem``) is not on it."""
    if shutil.which("ninja") is not None:
        return
    try:
        import ninja
    except ImportError:  # the build then says ninja is missing
        return
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


def build(name: str, source: Path, directory: Path) -> str | None:
    """Build (when its source or flags changed) and load operator library ``name`` from
    ``source`` in ``directory``: None, or why the build failed.

    Whoever holds :data:`BUILD_LOCK` removes a stale :data:`TORCH_LOCK` first, with a warning,
    since no other relmem build can be running then.
    """
    from torch.utils import cpp_extension

    put_ninja_on_path()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with FileLock(directory / BUILD_LOCK):
            stale = directory / TORCH_LOCK
            if stale.exists():
                warnings.warn(
                    f"removing {stale}, left by a build of the fused operators that was "
                    "interrupted (torch would wait for it forever)",
                    stacklevel=5,
                )
                stale.unlink(missing_ok=True)
            cpp_extension.load(
                name=name,
                sources=[str(source)],
                # -fopenmp: at::parallel_for is a header template whose threads are OpenMP's;
                # without it the operators' loops run on one thread whatever
                # torch.set_num_threads says (the process's libgomp is torch's own, so there is
                # one thread pool). -fno-math-errno, -fno-trapping-math: loops that call exp or
                # floor vectorise; neither changes a result (infinities and NaN keep IEEE
                # semantics).
                extra_cflags=[
                    "-O3",
                    "-march=native",
                    "-fopenmp",
                    "-fno-math-errno",
                    "-fno-trapping-math",
                ],
                extra_ldflags=["-fopenmp"],
                build_directory=str(directory),
                is_python_module=False,
                verbose=False,
            )
    except (RuntimeError, OSError, ImportError) as error:
        return str(error)
    return None
