"""Text corpora for language modelling: the files, the tokenisation, the vocabulary and a cache.

A corpus is a directory holding three splits in one of two layouts (``docs/tasks.md`` §3.1):
the WikiText release's ``wiki.{train,valid,test}.tokens`` or ``{train,valid,test}.txt`` (the
``pytorch/examples`` copy of WikiText-2, or any UTF-8 text laid out the same way).

Tokenisations:

- ``'word'``: the convention of ``docs/tasks.md`` §3.2. Every line, blank ones included, gives
  its whitespace-separated tokens and then ``<eos>``; token ids are assigned in order of first
  appearance over train, then valid, then test.
- ``'byte'``: the file's UTF-8 bytes as they are, ids 0-255 (newlines are bytes like any other).

The vocabulary (JSON) and the three id streams (safetensors) are cached in
``DATA_DIR/.relmem-cache/TOKENIZATION/`` and rebuilt whenever a file's content (its SHA-1,
computed once per load) differs from the one recorded; nothing is read back with pickle.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from relmem.tasks.language_model import wikitext

__all__ = ["EOS", "LAYOUTS", "SPLITS", "Corpus", "CorpusError", "find_split_files", "load_corpus"]

SPLITS = ("train", "valid", "test")
LAYOUTS: dict[str, dict[str, str]] = {
    "WikiText release": {s: f"wiki.{s}.tokens" for s in SPLITS},
    "train/valid/test.txt": {s: f"{s}.txt" for s in SPLITS},
}
EOS = "<eos>"
UNK = "<unk>"
CACHE_DIR = ".relmem-cache"
CACHE_FORMAT = 2  # 2: keyed on each file's SHA-1 (1: on its size and mtime)
Tokenization = Literal["word", "byte"]
TOKENIZATIONS = ("word", "byte")


class CorpusError(ValueError):
    """A data directory or file cannot be used; the message names it and what to do."""


@dataclass(frozen=True)
class Corpus:
    """A tokenised corpus.

    Attributes:
        vocab: the tokens in id order (``'byte'``: the 256 bytes as Latin-1 characters).
        train, valid, test: ``[N]`` int64 id streams.
        tokenization: ``'word'`` or ``'byte'``.
        files: the split files read.
        release: ``'wikitext-2'`` / ``'wikitext-103'`` when the files are recognised as one.
        differences: how the files differ from that release (empty: they match it).
    """

    vocab: list[str]
    train: Tensor
    valid: Tensor
    test: Tensor
    tokenization: str
    files: dict[str, Path] = field(default_factory=dict)
    release: str | None = None
    differences: tuple[str, ...] = ()

    @property
    def vocab_size(self) -> int:
        """V, the number of token ids."""
        return len(self.vocab)

    def split(self, name: str) -> Tensor:
        """The ``[N]`` id stream of ``'train'``, ``'valid'`` or ``'test'``."""
        if name not in SPLITS:
            raise KeyError(f"unknown split {name!r}; splits: {', '.join(SPLITS)}")
        return getattr(self, name)

    def encode(self, text: str) -> Tensor:
        """``[N]`` int64 ids of ``text``: its words (``'word'``; a word outside the vocabulary
        becomes ``<unk>``, and each line break ``<eos>``) or its UTF-8 bytes (``'byte'``).

        Raises:
            CorpusError: a word outside the vocabulary, which has no ``<unk>``.
        """
        if self.tokenization == "byte":
            return torch.tensor(list(text.encode("utf-8")), dtype=torch.int64)
        index = {token: i for i, token in enumerate(self.vocab)}
        words: list[str] = []
        for i, line in enumerate(text.split("\n")):
            words += ([EOS] if i else []) + line.split()
        unknown = sorted({w for w in words if w not in index})
        if unknown and UNK not in index:
            raise CorpusError(f"words outside the vocabulary (which has no {UNK}): {unknown[:5]}")
        return torch.tensor([index.get(w, index.get(UNK, 0)) for w in words], dtype=torch.int64)

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``: words joined by spaces with ``<eos>`` as a line break, or the
        bytes decoded as UTF-8 (invalid sequences replaced)."""
        ids = [int(i) for i in ids]
        if self.tokenization == "byte":
            return bytes(ids).decode("utf-8", errors="replace")
        lines: list[list[str]] = [[]]
        for i in ids:
            if self.vocab[i] == EOS:
                lines.append([])
            else:
                lines[-1].append(self.vocab[i])
        return "\n".join(" ".join(line) for line in lines)


def find_split_files(data_dir: Path) -> dict[str, Path]:
    """``{'train': path, 'valid': path, 'test': path}`` in one of the :data:`LAYOUTS`.

    Raises:
        CorpusError: the directory is missing, holds neither layout, or lacks a split.
    """
    data_dir = Path(data_dir)
    if data_dir.exists() and not data_dir.is_dir():
        raise CorpusError(
            f"data directory {data_dir} is a file, not a directory; pass the directory that "
            f"holds it ({data_dir.parent}) and its two companion splits"
        )
    if not data_dir.is_dir():
        raise CorpusError(
            f"data directory {data_dir} does not exist; it must hold wiki.train.tokens, "
            "wiki.valid.tokens and wiki.test.tokens (or train.txt, valid.txt and test.txt)"
        )
    for layout, names in LAYOUTS.items():
        present = {s: data_dir / n for s, n in names.items() if (data_dir / n).is_file()}
        if len(present) == len(SPLITS):
            return present
        if present:
            missing = [names[s] for s in SPLITS if s not in present]
            raise CorpusError(
                f"{data_dir} has {', '.join(p.name for p in present.values())} "
                f"({layout} layout) but not {', '.join(missing)}: all three splits are needed"
            )
    expected = " or ".join(", ".join(names.values()) for names in LAYOUTS.values())
    raise CorpusError(f"{data_dir} holds no corpus: expected the files {expected}")


def _read(path: Path) -> tuple[bytes, str]:
    """The bytes of ``path`` and their UTF-8 text; errors name the file."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CorpusError(f"cannot read {path}: {exc}") from exc
    if not data.strip():
        raise CorpusError(f"{path} is empty: every split needs some text")
    try:
        return data, data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise CorpusError(
            f"{path} is not UTF-8 text (byte {exc.start}, line {line}: {exc.reason}); "
            "convert it, e.g. iconv -f LATIN1 -t UTF-8"
        ) from exc


def word_lines(text: str) -> Iterable[list[str]]:
    """The tokens of each line of ``text``, ``<eos>`` last, blank lines included.

    Lines are split as a text-mode file reads them (``\\n``, ``\\r\\n`` or ``\\r``), as the
    reference loader does; tokens are ``str.split()``'s.
    """
    for line in io.StringIO(text, newline=None):
        yield line.split() + [EOS]


def _tokenise_words(texts: dict[str, str]) -> tuple[list[str], dict[str, Tensor]]:
    index: dict[str, int] = {}
    streams = {}
    for split in SPLITS:
        ids = (index.setdefault(w, len(index)) for line in word_lines(texts[split]) for w in line)
        streams[split] = torch.from_numpy(np.fromiter(ids, dtype=np.int64))
    return list(index), streams


def _tokenise_bytes(raw: dict[str, bytes]) -> tuple[list[str], dict[str, Tensor]]:
    streams = {s: torch.frombuffer(bytearray(raw[s]), dtype=torch.uint8).long() for s in SPLITS}
    return [chr(b) for b in range(256)], streams


def _sha1(path: Path) -> str:
    """The SHA-1 of ``path``'s bytes, read in blocks (a WikiText-103 split is 0.5 GB)."""
    digest = hashlib.sha1()
    try:
        with path.open("rb") as file:
            for block in iter(lambda: file.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise CorpusError(f"cannot read {path}: {exc}") from exc
    return digest.hexdigest()


def _fingerprint(files: dict[str, Path]) -> dict[str, dict[str, str]]:
    """Name and SHA-1 of each split file (what the cache is keyed on: an edit that keeps a
    file's size and modification time was read stale when they were the key)."""
    return {split: {"name": path.name, "sha1": _sha1(path)} for split, path in files.items()}


def _load_cache(folder: Path, prints: dict) -> tuple[list[str], dict[str, Tensor], dict] | None:
    """The cached vocabulary, streams and manifest, or None if absent, stale, unreadable or
    inconsistent (then the corpus is tokenised again): a manifest with the files' fingerprints
    and SHA-1s, a vocabulary of strings, and three 1-D int64 streams of ids within it."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
        if not isinstance(manifest, dict) or manifest.get("format") != CACHE_FORMAT:
            return None
        sha1s = manifest.get("sha1")
        if (
            manifest.get("files") != prints
            or not isinstance(sha1s, dict)
            or set(sha1s) != set(SPLITS)
        ):
            return None
        vocab = json.loads((folder / "vocab.json").read_text())
        streams = load_file(str(folder / "ids.safetensors"))
    except (OSError, ValueError, SafetensorError):
        return None
    if not isinstance(vocab, list) or not all(isinstance(token, str) for token in vocab):
        return None
    if set(streams) != set(SPLITS):
        return None
    for ids in streams.values():
        if ids.dim() != 1 or ids.dtype != torch.int64 or not ids.numel():
            return None
        if int(ids.min()) < 0 or int(ids.max()) >= len(vocab):
            return None
    return vocab, streams, manifest


def _save_cache(folder: Path, vocab: list[str], streams: dict[str, Tensor], manifest: dict) -> None:
    """Write the cache (manifest last, so a half-written cache is never taken as valid)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "manifest.json").unlink(missing_ok=True)
        for name, write in (
            ("vocab.json", lambda p: p.write_text(json.dumps(vocab, ensure_ascii=False))),
            ("ids.safetensors", lambda p: save_file(streams, str(p))),
            ("manifest.json", lambda p: p.write_text(json.dumps(manifest, indent=2))),
        ):
            tmp = folder / f".{name}.{os.getpid()}.tmp"  # data-parallel ranks write at once
            write(tmp)
            os.replace(tmp, folder / name)
    except OSError as exc:
        warnings.warn(f"cannot cache the tokenised corpus in {folder} ({exc})", stacklevel=3)


def load_corpus(
    data_dir: str | Path,
    tokenization: Tokenization = "word",
    *,
    expect: str | None = None,
    cache: bool = True,
) -> Corpus:
    """Read, tokenise and (through the cache) load the corpus in ``data_dir``.

    When the files are recognised as WikiText-2 or WikiText-103 (a file's SHA-1 is one of the
    release's, ``docs/tasks.md`` §3.2), word-level loading checks every file's SHA-1, the token
    counts and the vocabulary size against the release and warns about each difference.

    Args:
        data_dir: a directory in one of the :data:`LAYOUTS`.
        tokenization: ``'word'`` or ``'byte'``.
        expect: ``'wikitext-2'`` or ``'wikitext-103'``: the files must be that release, and
            different token counts or vocabulary size are an error (SHA-1s are not checked:
            a re-exported copy has other bytes but the same tokens).
        cache: read and write the cache beside the data.

    Returns:
        :class:`Corpus`.

    Raises:
        CorpusError: a missing, empty or non-UTF-8 file, a missing split, or (``expect``) counts
            that differ from the release's.
    """
    if tokenization not in TOKENIZATIONS:
        raise CorpusError(f"tokenization must be one of {TOKENIZATIONS}, got {tokenization!r}")
    if expect is not None and expect not in wikitext.RELEASES:
        raise CorpusError(f"expect must be one of {tuple(wikitext.RELEASES)}, got {expect!r}")
    files = find_split_files(Path(data_dir))
    prints = _fingerprint(files)
    folder = Path(data_dir) / CACHE_DIR / tokenization
    cached = _load_cache(folder, prints) if cache else None
    if cached is not None:
        vocab, streams, manifest = cached
        sha1s = manifest["sha1"]
    else:
        raw, texts = {}, {}
        for split, path in files.items():
            raw[split], texts[split] = _read(path)
        sha1s = {s: hashlib.sha1(raw[s]).hexdigest() for s in SPLITS}
        # the bytes tokenised (a file replaced since it was hashed is keyed on what was read)
        prints = {s: {"name": files[s].name, "sha1": sha1s[s]} for s in SPLITS}
        if tokenization == "word":
            vocab, streams = _tokenise_words(texts)
        else:
            vocab, streams = _tokenise_bytes(raw)
        if cache:
            manifest = {"format": CACHE_FORMAT, "files": prints, "sha1": sha1s}
            _save_cache(folder, vocab, streams, manifest)
    release, differences = None, ()
    if tokenization == "word":
        counts = {s: int(streams[s].numel()) for s in SPLITS}
        release = expect or wikitext.recognise(sha1s)
        if release is not None:
            differences = tuple(
                wikitext.differences(release, sha1s, counts, len(vocab), check_sha1=not expect)
            )
        if expect and differences:
            raise CorpusError(
                f"{data_dir} should hold {expect} but: {'; '.join(differences)}. "
                + wikitext.how_to_get(expect)
            )
        if differences:
            warnings.warn(
                f"{data_dir} looks like {release} but differs from the standard release: "
                + "; ".join(differences),
                stacklevel=2,
            )
    return Corpus(
        vocab,
        streams["train"],
        streams["valid"],
        streams["test"],
        tokenization,
        files,
        release,
        differences,
    )
