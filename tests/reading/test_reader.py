"""The reader's parts against slow, obviously-correct references, and padding's inertness."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from relmem.models.reader import Trilinear, _BiGRU, windowed_self_attention
from relmem.tasks.reading.task import best_spans


def reference_window_attention(g, mask, window, score):
    """Token by token: in a row whose valid tokens all lie in the first window, attention over
    them all but t; in a longer one, the window of each cut holding token t, the cut in which
    t lies further from an edge (the first cut on ties), attention over that window's valid
    tokens but t."""
    batch, steps, _ = g.shape
    out = torch.zeros_like(g)
    for b in range(batch):
        for t in range(steps):
            if not mask[b, t]:
                continue
            if not mask[b, window:].any():  # the row fits in one window
                lo, hi = 0, steps
            else:
                cuts = []
                for offset in (0, window // 2):
                    inside = (t + offset) % window
                    lo = t - inside
                    cuts.append((min(inside, window - 1 - inside), max(lo, 0), lo + window))
                best = cuts[1] if cuts[1][0] > cuts[0][0] else cuts[0]
                lo, hi = best[1], min(best[2], steps)
            keys = [j for j in range(lo, hi) if mask[b, j] and j != t]
            s = score(g[b : b + 1, t : t + 1], g[b : b + 1, keys])[0, 0]  # [K]
            out[b, t] = torch.softmax(s, 0) @ g[b, keys]
    return out


@pytest.mark.parametrize(
    ("steps", "window"), [(7, 8), (23, 8), (24, 6), (9, 2), (31, 7), (17, 5), (40, 12)]
)
def test_windowed_attention_matches_the_token_by_token_reference(steps, window) -> None:
    torch.manual_seed(0)
    g = torch.randn(4, steps, 5, dtype=torch.float64, requires_grad=True)
    # the third row: longer than a window, so cut, but leaving the cuts' last windows empty
    lengths = torch.tensor([steps, steps - 3, min(window + 2, steps), 4])
    mask = torch.arange(steps) < lengths.unsqueeze(1)
    score = Trilinear(5).double()
    fast = windowed_self_attention(g, mask, window, score)
    slow = reference_window_attention(g, mask, window, score)
    torch.testing.assert_close(fast, slow)
    weights = torch.randn_like(fast)  # and backward: the input's and the score's gradients
    wrt = [g, *score.parameters()]
    torch.testing.assert_close(
        torch.autograd.grad((fast * weights).sum(), wrt),
        torch.autograd.grad((slow * weights).sum(), wrt),
    )
    if window >= 4:  # every valid token is covered (a window of 2 may hold a token alone)
        assert (fast.abs().sum(-1) > 0)[mask].all()


def test_best_spans_match_brute_force() -> None:
    torch.manual_seed(1)
    logits = torch.randn(6, 1 + 12, 2, dtype=torch.float64)
    logits[:, 10:] = float("-inf")  # padding: 9 context tokens
    logits[:3, 0] = float("-inf")  # rows 0-2 cannot say "no answer"
    logits[5, 0] = 50.0  # row 5 says it
    first, last, score = best_spans(logits, 4)
    for b in range(6):
        s, e = logits[b, 1:, 0], logits[b, 1:, 1]
        pairs = [(s[i] + e[j], i, j) for i in range(9) for j in range(i, min(i + 4, 9))]
        value, i, j = max(pairs)
        if logits[b, 0].sum() > value:
            value, i, j = logits[b, 0].sum(), -1, -1
        assert (int(first[b]), int(last[b])) == (i, j)
        assert float(score[b]) == pytest.approx(float(value))
    assert int(first[5]) == -1


def test_bigru_equals_packed_sequences() -> None:
    torch.manual_seed(2)
    rnn = _BiGRU(4, 3, 0.0)
    x = torch.randn(3, 6, 4)
    lengths = torch.tensor([6, 2, 4])
    reference = nn.GRU(4, 3, batch_first=True, bidirectional=True)
    with torch.no_grad():
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(reference, f"{name}_l0").copy_(getattr(rnn.forward_gru, f"{name}_l0"))
            getattr(reference, f"{name}_l0_reverse").copy_(getattr(rnn.backward_gru, f"{name}_l0"))
    packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    expected, _ = nn.utils.rnn.pad_packed_sequence(reference(packed)[0], True, total_length=6)
    torch.testing.assert_close(rnn(x, lengths), expected)


def test_windowed_attention_of_a_row_does_not_depend_on_the_rows_beside_it() -> None:
    torch.manual_seed(3)
    score = Trilinear(5).double()
    g = torch.randn(2, 30, 5, dtype=torch.float64)
    for length in (5, 8, 13, 30):  # within one window of 8, and longer
        mask = torch.arange(30) < torch.tensor([[30], [length]])
        together = windowed_self_attention(g, mask, 8, score)[1, :length]
        alone = windowed_self_attention(g[1:, :length], mask[1:, :length], 8, score)[0]
        torch.testing.assert_close(together, alone)
