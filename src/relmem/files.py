"""Opening the files a user, a run or a download hands to relmem, safely.

Every file relmem reads that it did not just write itself (a run's or an exported folder's
JSON, a vocabulary, a dataset, word vectors) goes through :func:`open_regular`, so that:

- a FIFO, a device (``/dev/zero``), a socket or a folder is refused before any read (a FIFO
  opened for reading would block until a writer came; a device would be read forever);
- a file larger than its kind may be (a multi-gigabyte sparse ``config.json``) is refused
  from its size, before a byte is read;
- a symbolic link is followed (a Hugging Face Hub snapshot is a folder of links into the
  Hub's cache), and the message names where it led.

:func:`read_json` adds JSON parsing that reports nesting too deep for Python's parser (a file
of ``[[[[...`` 100,000 deep) as one line rather than a ``RecursionError`` traceback. Every
error is a :class:`FileRefused` (a ``ValueError``) whose message names the file and the fix;
callers with their own error class (``SquadError``, ``ExportError``) wrap it.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

__all__ = [
    "MiB",
    "FileRefused",
    "file_digest",
    "open_regular",
    "read_bytes",
    "read_json",
    "stream_digest",
]

MiB = 1 << 20


class FileRefused(ValueError):
    """A file that relmem will not read (missing, not a regular file, too large, not JSON);
    the message names it and says why."""


def _kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _named(path: Path) -> str:
    """``path``, with where it leads when it is a symbolic link."""
    if path.is_symlink():
        return f"{path} (a link to {os.path.realpath(path)})"
    return str(path)


def open_regular(path: str | os.PathLike[str], max_bytes: int | None = None) -> int:
    """An open, read-only file descriptor of ``path`` once it is a regular file of at most
    ``max_bytes`` bytes (None: any size). The caller closes it.

    The file is opened without blocking and checked through the descriptor (``fstat``), so a
    FIFO never blocks and a file swapped after the check is still the one checked.

    Raises:
        FileRefused: ``path`` is missing, unreadable, not a regular file or too large.
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise FileRefused(f"{_named(path)} does not exist") from None
    except IsADirectoryError:
        raise FileRefused(f"{_named(path)} is a folder, not a file") from None
    except OSError as exc:
        raise FileRefused(f"cannot open {_named(path)}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FileRefused(
                f"{_named(path)} is {_kind(info.st_mode)}, not a regular file: relmem reads "
                "only regular files here"
            )
        if max_bytes is not None and info.st_size > max_bytes:
            raise FileRefused(
                f"{_named(path)} is {info.st_size:,} bytes, more than the {max_bytes:,} such a "
                "file may hold: it is not the file relmem wrote, or it is damaged"
            )
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path: str | os.PathLike[str], max_bytes: int | None = None) -> bytes:
    """The bytes of the regular file ``path`` (:func:`open_regular`'s checks), never more
    than ``max_bytes`` even if it grows while read.

    Raises:
        FileRefused: as :func:`open_regular`, or the read failed.
    """
    fd = open_regular(path, max_bytes)
    with os.fdopen(fd, "rb") as handle:
        try:
            data = handle.read() if max_bytes is None else handle.read(max_bytes + 1)
        except OSError as exc:
            raise FileRefused(f"cannot read {_named(Path(path))}: {exc.strerror or exc}") from None
    if max_bytes is not None and len(data) > max_bytes:
        raise FileRefused(f"{_named(Path(path))} grew past {max_bytes:,} bytes while read")
    return data


def read_json(path: str | os.PathLike[str], max_bytes: int | None = None) -> Any:
    """The JSON value in the UTF-8 file ``path`` (:func:`read_bytes`'s checks).

    Raises:
        FileRefused: as :func:`read_bytes`, or the file is not UTF-8, not JSON, or nested
            deeper than Python's parser reaches.
    """
    path = Path(path)
    data = read_bytes(path, max_bytes)
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise FileRefused(
            f"{_named(path)} is not UTF-8 text (byte {exc.start}), so not the JSON file relmem "
            "reads there (a binary file, such as a pickle, in its place?)"
        ) from None
    except json.JSONDecodeError as exc:
        raise FileRefused(
            f"{_named(path)} is not JSON ({exc.msg} at line {exc.lineno} column {exc.colno}), "
            "so not the file relmem reads there"
        ) from None
    except RecursionError:
        raise FileRefused(
            f"{_named(path)} is JSON nested deeper than relmem reads (lists or objects inside "
            "each other thousands deep): it is not a file relmem wrote or reads"
        ) from None


def stream_digest(handle: BinaryIO, algorithm: str) -> str:
    """The hex digest (``hashlib``'s ``algorithm``: ``"sha1"``, ``"sha256"``) of the bytes
    ``handle`` reads, from where it stands to the end, a megabyte at a time."""
    digest = hashlib.new(algorithm)
    for block in iter(lambda: handle.read(1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()


def file_digest(path: str | os.PathLike[str], algorithm: str) -> str:
    """The hex digest of a regular file's bytes (:func:`stream_digest`): content, never size
    and time, keys relmem's caches and checks its checkpoints and exports.

    Raises:
        FileRefused: as :func:`open_regular`, or the read failed.
    """
    with os.fdopen(open_regular(path), "rb") as handle:
        try:
            return stream_digest(handle, algorithm)
        except OSError as exc:
            raise FileRefused(f"cannot read {_named(Path(path))}: {exc.strerror or exc}") from None
