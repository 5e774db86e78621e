"""``ReaderOptions.paragraph_ranks`` (``--task.rank-prior``): a learned start and end score for
each rank of the paragraph a context token stands in, added to the reader's own scores.
Checked against the same reader without it: equal where the prior is zero, shifted by exactly
the prior's scores where it is not, and its gradient that of the scores it shifts."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from relmem.models.reader import RANK_PRIOR_SCALE, Reader, ReaderOptions

Q = 4  # the question block
CHARS = 3
RANKS = 3


def readers(windows: bool = False) -> tuple[Reader, Reader]:
    """A reader with a rank prior over ranks 1..3 and one without, with the same weights."""
    torch.manual_seed(0)
    options = ReaderOptions(
        vocab_size=30, char_vocab_size=12, question_block=Q, chars=CHARS, word_size=6,
        char_embedding=4, char_channels=5, char_kernel=3, hidden_size=4, attention_window=4,
        dropout=0.0, windows=windows,
    )  # fmt: skip
    plain = Reader(options, []).double()
    ranked = Reader(dataclasses.replace(options, paragraph_ranks=RANKS), []).double()
    missing, unexpected = ranked.load_state_dict(plain.state_dict(), strict=False)
    assert missing == ["rank_prior.weight"] and not unexpected
    return ranked, plain


def rows(gap: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows with their paragraphs' ranks in the last column: row 0 three paragraphs
    (ranks 2, 4, 1: 4 lies past the prior's 3 ranks), row 1 one (rank 1), ``gap`` padding
    steps between two paragraphs; ``(inputs [2, Q + T, 3 + C + 1], lengths [2])``."""
    generator = torch.Generator().manual_seed(1)
    sizes, ranks = [[3, 2, 4], [5]], [[2, 4, 1], [1]]
    made = []
    for row_sizes, row_ranks in zip(sizes, ranks, strict=True):
        parts = [torch.cat([torch.randint(2, 30, (3, 1), generator=generator),
                            torch.zeros(Q - 3, 1, dtype=torch.int64)])]  # fmt: skip
        parts[0] = torch.cat([parts[0], torch.zeros(Q, 2 + CHARS + 1, dtype=torch.int64)], dim=1)
        for k, (size, rank) in enumerate(zip(row_sizes, row_ranks, strict=True)):
            if k:
                parts.append(torch.zeros(gap, 4 + CHARS, dtype=torch.int64))
            words = torch.randint(2, 30, (size, 1), generator=generator)
            flags = torch.randint(0, 2, (size, 2), generator=generator)
            chars = torch.randint(1, 12, (size, CHARS), generator=generator)
            parts.append(torch.cat([words, flags, chars, torch.full((size, 1), rank)], dim=1))
        made.append(torch.cat(parts))
    steps = max(len(r) for r in made)
    inputs = torch.stack([torch.cat([r, r.new_zeros(steps - len(r), r.shape[1])]) for r in made])
    return inputs.int(), torch.tensor([len(r) for r in made])


@pytest.mark.parametrize("windows", [False, True])
def test_the_rank_prior_adds_its_score_for_each_tokens_paragraph_rank(windows: bool) -> None:
    ranked, plain = readers(windows)
    inputs, lengths = rows(gap=1 if windows else 0)
    base, _ = plain(inputs[..., :-1], lengths=lengths)
    # a prior of zeros (its start) changes nothing
    torch.testing.assert_close(ranked(inputs, lengths=lengths)[0], base)
    prior = torch.tensor([[0.0, 0.0], [1.5, -0.5], [0.25, 2.0], [-3.0, 0.75]], dtype=torch.float64)
    with torch.no_grad():
        ranked.rank_prior.weight.copy_(prior)
    logits, _ = ranked(inputs, lengths=lengths)
    ranks = inputs[:, Q:, -1].long().clamp(max=RANKS)  # rank 4 shares rank 3's scores
    expected = base.clone()
    expected[:, 1:] += RANK_PRIOR_SCALE * prior[ranks].to(base.dtype)
    torch.testing.assert_close(logits, expected)
    assert torch.isinf(logits[1, 1 + 5 :]).all()  # padding stays -inf
    # backward: the prior's gradient for a rank sums the scores' gradients over its tokens
    # (times the scale),
    # and every other weight's gradient is the reader's without the prior
    generator = torch.Generator().manual_seed(2)
    weights = torch.randn(logits.shape, dtype=logits.dtype, generator=generator)
    finite = torch.isfinite(logits)
    (logits.masked_fill(~finite, 0) * weights.masked_fill(~finite, 0)).sum().backward()
    (base.masked_fill(~finite, 0) * weights.masked_fill(~finite, 0)).sum().backward()
    per_token = weights[:, 1:].masked_fill(~finite[:, 1:], 0).double()
    want = torch.zeros(RANKS + 1, 2, dtype=torch.float64)
    want.index_add_(0, ranks.flatten(), RANK_PRIOR_SCALE * per_token.flatten(0, 1))
    want[0] = 0  # question and padding steps: no prior
    # the scores are float32 (the span head's), so the prior's gradient is summed in float32
    torch.testing.assert_close(ranked.rank_prior.weight.grad, want, rtol=1e-6, atol=1e-6)
    plain_grads = dict(plain.named_parameters())
    for name, parameter in ranked.named_parameters():
        if name != "rank_prior.weight":
            torch.testing.assert_close(parameter.grad, plain_grads[name].grad, msg=name)


def test_inputs_without_the_rank_column_are_refused() -> None:
    ranked, plain = readers()
    inputs, lengths = rows(gap=0)
    with pytest.raises(ValueError, match=r"must be \[B, steps, 7\] \(3 \+ 3 characters \+ a "
                                         r"paragraph rank\), got \[2, \d+, 6\]"):  # fmt: skip
        ranked(inputs[..., :-1], lengths=lengths)
    with pytest.raises(ValueError, match=r"must be \[B, steps, 6\] \(3 \+ 3 characters\)"):
        plain(inputs, lengths=lengths)


def test_exports_from_before_the_rank_prior_have_none() -> None:
    fields = {f.name: f.default for f in dataclasses.fields(ReaderOptions)}
    assert fields["paragraph_ranks"] == 0
