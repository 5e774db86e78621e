"""The one line a command prints for an error it reports (``relmem CMD: error: ...``)."""

from __future__ import annotations

from relmem.train.checkpoint import CheckpointError


def describe_error(exc: BaseException, checkpoint_option: str) -> str:
    """``exc`` as one line that names what was wrong.

    Args:
        exc: the error. A ``KeyError`` shows its message without quotes; an ``OSError`` shows
            its file(s) and the system's reason; a :class:`CheckpointError` with a fallback
            adds how to use it with this command's option.
        checkpoint_option: the command's option that takes a checkpoint (``--resume``,
            ``--checkpoint``).
    """
    if isinstance(exc, KeyError) and exc.args:
        text = str(exc.args[0])
    elif isinstance(exc, OSError) and exc.filename is not None:
        files = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
        text = f"{files}: {exc.strerror or exc}"
    else:
        text = str(exc)
    if isinstance(exc, CheckpointError) and exc.fallback is not None:
        text = f"{text.rstrip('.')} (to use it: {checkpoint_option} {exc.fallback})"
    return " ".join(text.split())
