"""Batchify and truncated-BPTT windows over an id stream (``docs/tasks.md`` §3.3).

A split's ``[N]`` ids are cut to a multiple of the row count ``B`` and laid out as ``B``
contiguous rows, ``[B, N // B]``: row ``b`` is ``ids[b·L : (b+1)·L]``, so a contiguous block of
rows (a data-parallel rank's share) is a contiguous slice of the stream. Window ``w`` holds
inputs ``rows[:, w·bptt : w·bptt + n]`` and targets one step later, ``n = min(bptt, L - 1 -
w·bptt)``: the windows cover every predicted token of every row once, in order, and the last
one may be shorter.
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["batchify", "num_windows", "window"]


def batchify(ids: Tensor, rows: int) -> Tensor:
    """``ids [N]`` as ``[rows, N // rows]`` contiguous rows (the remainder dropped).

    Raises:
        ValueError: fewer than two tokens per row (nothing to predict).
    """
    length = ids.numel() // rows
    if length < 2:
        raise ValueError(
            f"a stream of {ids.numel()} tokens cannot fill {rows} rows of at least 2 tokens; "
            "use a smaller batch or more text"
        )
    return ids[: rows * length].view(rows, length)


def num_windows(length: int, bptt: int) -> int:
    """Windows of at most ``bptt`` predicted steps in a row of ``length`` tokens."""
    return -(-(length - 1) // bptt)


def window(rows: Tensor, index: int, bptt: int) -> tuple[Tensor, Tensor]:
    """``(inputs, targets)``, each ``[B, n]``: window ``index`` of ``rows [B, L]``."""
    start = index * bptt
    stop = min(start + bptt, rows.shape[1] - 1)
    return rows[:, start:stop], rows[:, start + 1 : stop + 1]
