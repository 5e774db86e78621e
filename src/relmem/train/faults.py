"""A test hook that kills the process at a named point of a checkpoint or log write.

The fault-injection tests need to die *inside* the short windows where a file is half written;
waiting for a random signal to land there would take luck. With the environment variable
``RELMEM_TEST_KILL_AT=POINT@STEP`` set, the process sends itself SIGKILL when it reaches
``POINT`` while writing the record or checkpoint of step ``STEP``. Points:

- ``checkpoint``: the staging directory holds the weights, the training state is not written;
- ``checkpoint-rename``: the new checkpoint is in place, ``latest`` still names the previous one;
- ``log``: half of the metric line of that step is written and flushed.

Unset (always, outside the tests), :func:`armed` is one dictionary look-up.
"""

from __future__ import annotations

import os
import signal

KILL_AT_ENV = "RELMEM_TEST_KILL_AT"


def armed(point: str, step: int) -> bool:
    """Whether the hook asks to die at ``point`` of step ``step``."""
    return os.environ.get(KILL_AT_ENV) == f"{point}@{step}"


def kill_if_armed(point: str, step: int) -> None:
    """SIGKILL this process if the hook names ``point`` at ``step``."""
    if armed(point, step):
        os.kill(os.getpid(), signal.SIGKILL)
