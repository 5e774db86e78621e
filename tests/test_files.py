"""relmem.files: what every reader of an outside file refuses before it reads."""

from __future__ import annotations

import os
import threading

import pytest

from relmem.files import FileRefused, read_bytes, read_json


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda p: None, "does not exist"),
        (lambda p: p.mkdir(), "is a folder"),
        (lambda p: os.mkfifo(p), "is a FIFO"),
        (lambda p: os.symlink("/dev/zero", p), "a link to /dev/zero) is a device"),
        (lambda p: p.write_bytes(b"x" * 11), "11 bytes, more than the 10"),
    ],
    ids=["missing", "folder", "fifo", "device-link", "too-large"],
)
def test_refused_before_reading(tmp_path, make, expected):
    path = tmp_path / "config.json"
    make(path)
    result: list[BaseException] = []

    def read() -> None:
        try:
            read_bytes(path, max_bytes=10)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            result.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive(), "reading blocked"
    assert isinstance(result[0], FileRefused)
    assert expected in str(result[0]) and str(path) in str(result[0])


def test_sparse_file_refused_from_its_size(tmp_path):
    path = tmp_path / "vocab.json"
    with open(path, "wb") as f:
        f.truncate(1 << 34)  # 16 GiB of nothing: refused without reading a byte
    with pytest.raises(FileRefused, match="17,179,869,184 bytes"):
        read_json(path, max_bytes=1 << 20)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested deeper"),
        ("{", "not JSON"),
        (b"\xff\xfe", "not UTF-8"),
    ],
    ids=["deep", "broken", "not-utf8"],
)
def test_json_errors_are_one_line(tmp_path, text, expected):
    path = tmp_path / "data.json"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(FileRefused, match=expected) as info:
        read_json(path)
    assert "\n" not in str(info.value)


def test_link_to_a_regular_file_is_read(tmp_path):
    target = tmp_path / "blob"
    target.write_text('{"a": 1}')
    (tmp_path / "config.json").symlink_to(target)
    assert read_json(tmp_path / "config.json", max_bytes=100) == {"a": 1}
