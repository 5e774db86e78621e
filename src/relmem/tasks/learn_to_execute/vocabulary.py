"""The 45-symbol character vocabulary of Learning to Execute (``docs/tasks.md`` §2.2, §2.3).

Indices are fixed so that they agree with the reference. Programs and results only ever use
single characters; indices 0-2 and the words ``else``, ``for``, ``if``, ``range`` are kept for
the numbering alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

SYMBOLS: tuple[str, ...] = (
    "_unk_",
    "_null_",
    "_eos_",
    "|",
    " ",
    "!",
    "(",
    ")",
    "*",
    "+",
    "-",
    ".",
    "/",
    *"0123456789",
    ":",
    "<",
    "=",
    ">",
    "[",
    "]",
    "a",
    "e",
    "else",
    "f",
    "for",
    "g",
    "i",
    "if",
    "l",
    "n",
    "o",
    "r",
    "range",
    "s",
    "x",
    "~",
)
VOCAB_SIZE = len(SYMBOLS)  # 45
INDEX = {symbol: i for i, symbol in enumerate(SYMBOLS)}
PAD = INDEX["."]  # 11: right padding of inputs and targets
START = INDEX["~"]  # 44: first input of the teacher-forced decoder
END = INDEX["!"]  # 5: the end symbol (never appended)


def encode(text: str) -> list[int]:
    """The indices of ``text``'s characters.

    Raises:
        ValueError: naming a character outside the vocabulary.
    """
    try:
        return [INDEX[c] for c in text]
    except KeyError as exc:
        raise ValueError(f"character {exc.args[0]!r} is not in the LTE vocabulary") from None


def decode(indices: Sequence[int] | Tensor, length: int | None = None) -> str:
    """The text of ``indices`` (the first ``length`` of them; None: all)."""
    values = indices.tolist() if isinstance(indices, Tensor) else list(indices)
    return "".join(SYMBOLS[i] for i in values[:length])


def pad_batch(texts: Sequence[str], steps: int) -> tuple[Tensor, Tensor]:
    """Encode ``texts`` right-padded with ``.`` to ``steps``.

    Returns:
        ``(tokens [n, steps] int64, lengths [n] int64)``.

    Raises:
        ValueError: a text is longer than ``steps``.
    """
    tokens = torch.full((len(texts), steps), PAD, dtype=torch.int64)
    lengths = torch.tensor([len(t) for t in texts], dtype=torch.int64)
    for row, text in enumerate(texts):
        if len(text) > steps:
            raise ValueError(f"{text!r} has {len(text)} characters; at most {steps} fit")
        tokens[row, : len(text)] = torch.tensor(encode(text), dtype=torch.int64)
    return tokens, lengths
