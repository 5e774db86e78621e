"""Pretrained word vectors in GloVe's text format (``--task.embeddings PATH``).

The file is streamed line by line (``word v_1 .. v_D``) and only the vocabulary's words are
kept, so GloVe's 840B release (5.6 GB) costs one pass, not its size in memory. A vocabulary
word takes the vector of its lower-cased form when the file has one, else of its first cased
form (GloVe 840B is cased; the vocabulary is lower-cased). The restricted matrix is cached
beside the file (safetensors), keyed on the vocabulary and the SHA-1 of the file's bytes (an
edited file is read again even when its size and time are unchanged), so a later build of the
same run's model hashes the file but does not parse it again.
"""

from __future__ import annotations

import io
import math
import os
import sys
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from relmem.files import FileRefused, open_regular, stream_digest
from relmem.tasks.reading.data import CACHE_DIR, PAD, Vocabulary, write_cache

__all__ = ["read_word_vectors"]


def read_word_vectors(path: Path, vocabulary: Vocabulary, size: int) -> Tensor:
    """``[vocabulary.size, size]`` float32 initial word vectors: the file's vector for each
    word it has, ``N(0, 0.1²)`` for the others (seeded by the torch generator), 0 for padding.

    Raises:
        ValueError: the file is missing or not a regular file, not UTF-8, or a line's width
            differs from ``size`` (naming the line and ``--task.word-size``), or a vocabulary
            word's vector holds something that is not a number, or NaN or an infinity
            (naming the line).
    """
    path = Path(path)
    try:
        handle = os.fdopen(open_regular(path), "rb")
    except FileRefused as exc:
        raise ValueError(f"--task.embeddings {exc}; pass a GloVe-format text file") from None
    with handle:
        key = f"{vocabulary.identity()['sha1']}-{stream_digest(handle, 'sha1')}-{size}"
        cache = path.parent / CACHE_DIR / f"{path.name}.{key}.safetensors"
        try:
            return load_file(cache)["vectors"]
        except (OSError, SafetensorError, KeyError):
            pass
        handle.seek(0)
        vectors, seen = _read_vectors(path, io.TextIOWrapper(handle, "utf-8"), vocabulary, size)
    print(
        f"relmem: {int(seen.sum()):,} of {vocabulary.size - 2:,} words have vectors in {path}",
        file=sys.stderr,
    )
    # a read-only folder: the file is read again next time
    write_cache(cache, lambda tmp: save_file({"vectors": vectors.contiguous()}, tmp), None)
    return vectors


def _read_vectors(
    path: Path, lines: io.TextIOWrapper, vocabulary: Vocabulary, size: int
) -> tuple[Tensor, Tensor]:
    """The initial vectors ``[vocabulary.size, size]`` from the GloVe text ``lines`` of
    ``path``, and which words ``[vocabulary.size]`` bool the file gave a vector.

    Raises:
        ValueError: as :func:`read_word_vectors`.
    """
    index = {word: i + 2 for i, word in enumerate(vocabulary.words)}
    vectors = torch.randn(vocabulary.size, size) * 0.1
    vectors[PAD] = 0
    exact = torch.zeros(vocabulary.size, dtype=torch.bool)
    seen = torch.zeros(vocabulary.size, dtype=torch.bool)
    try:
        for number, line in enumerate(lines, 1):
            parts = line.rstrip("\n").rstrip(" ").split(" ")
            if len(parts) - 1 != size:
                raise ValueError(
                    f"--task.embeddings {path} line {number}: {len(parts) - 1} numbers "
                    f"after the word, expected {size} (--task.word-size {size}); pass "
                    "--task.word-size with the file's width"
                )
            word = parts[0]
            i = index.get(word.lower())
            if i is None or exact[i] or (seen[i] and word != word.lower()):
                continue
            try:
                values = [float(x) for x in parts[1:]]
            except ValueError:
                raise ValueError(
                    f"--task.embeddings {path} line {number}: not a number in the vector "
                    f"of {word!r}"
                ) from None
            bad = next((v for v in values if not math.isfinite(v)), None)
            if bad is not None:
                raise ValueError(
                    f"--task.embeddings {path} line {number}: the vector of {word!r} holds "
                    f"{bad}; word vectors must be finite numbers: fix or remove the line"
                )
            vectors[i] = torch.tensor(values)
            seen[i] = True
            exact[i] = word == word.lower()
    except UnicodeDecodeError as exc:
        raise ValueError(f"--task.embeddings {path}: not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise ValueError(f"--task.embeddings {path}: {exc.strerror or exc}") from None
    return vectors, seen
