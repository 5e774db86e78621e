"""``ReaderOptions.windows`` (``--task.reading windows``): each run of context tokens between
padding steps is read as a context of its own. Checked against its obvious reference: every
window packed as a row of its own and read by the same weights in one pass."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from relmem.models import DNCModelConfig
from relmem.models.reader import DNCMemory, Reader, ReaderOptions, padding_windows

Q = 4  # the question block


def test_padding_windows_are_the_runs_of_tokens_between_padding() -> None:
    words = torch.tensor([[5, 6, 0, 7, 0, 0, 9], [0, 3, 3, 3, 0, 4, 0], [8, 8, 8, 8, 8, 8, 8]])
    lengths = torch.tensor([6, 7, 5])  # row 0's 9 and row 2's last two lie past its length
    row, first, length = padding_windows(words, lengths)
    assert row.tolist() == [0, 0, 1, 1, 2]
    assert first.tolist() == [0, 3, 1, 5, 0]
    assert length.tolist() == [2, 1, 3, 1, 5]


def reader(memory: str, windows: bool, no_answer: bool = False) -> Reader:
    torch.manual_seed(0)
    options = ReaderOptions(
        vocab_size=30, char_vocab_size=12, question_block=Q, chars=3, word_size=6,
        char_embedding=4, char_channels=5, char_kernel=3, hidden_size=4, attention_window=4,
        dropout=0.0, no_answer=no_answer, windows=windows,
    )  # fmt: skip
    size = 2 * options.hidden_size
    layers = (
        []
        if memory == "none"
        else [
            DNCMemory(size, options, DNCModelConfig(memory_size=4, word_size=3, num_read_heads=2))
        ]
    )
    return Reader(options, layers).double()


def token(generator: torch.Generator, count: int) -> torch.Tensor:
    """``[count, 3 + 3]`` int32 tokens: word ids 2.., exact-match flags, character ids."""
    words = torch.randint(2, 30, (count, 1), generator=generator)
    flags = torch.randint(0, 2, (count, 2), generator=generator)
    chars = torch.randint(0, 12, (count, 3), generator=generator)
    return torch.cat([words, flags, chars], dim=1).int()


def packed(question: torch.Tensor, paragraphs: list[torch.Tensor], gap: int) -> torch.Tensor:
    """One row: the question block, then the paragraphs ``gap`` padding steps apart."""
    row = [torch.cat([question, question.new_zeros(Q - len(question), question.shape[1])])]
    for k, paragraph in enumerate(paragraphs):
        row += [paragraph.new_zeros(gap if k else 0, paragraph.shape[1]), paragraph]
    return torch.cat(row)


def batch(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` right-padded to the longest, and their lengths."""
    steps = max(len(r) for r in rows)
    inputs = torch.stack([torch.cat([r, r.new_zeros(steps - len(r), r.shape[1])]) for r in rows])
    return inputs, torch.tensor([len(r) for r in rows])


@pytest.mark.parametrize("memory", ["none", "dnc"])
@pytest.mark.parametrize("no_answer", [False, True])
def test_windows_read_each_paragraph_as_a_row_of_its_own_forward_and_backward(
    memory: str, no_answer: bool
) -> None:
    generator = torch.Generator().manual_seed(1)
    questions = [token(generator, 3), token(generator, 2)]
    paragraphs = [[token(generator, 5), token(generator, 3), token(generator, 6)],
                  [token(generator, 4)]]  # fmt: skip
    # the windows reader: one row per question, its paragraphs one padding step apart
    inputs, lengths = batch(
        [packed(q, ps, gap=1) for q, ps in zip(questions, paragraphs, strict=True)]
    )
    windows = reader(memory, windows=True, no_answer=no_answer)
    logits, _ = windows(inputs, lengths=lengths)
    # the reference: the same weights, each paragraph a row of its own read in one pass
    alone = reader(memory, windows=False, no_answer=no_answer)
    alone.load_state_dict(windows.state_dict())
    singles = [(b, p) for b, ps in enumerate(paragraphs) for p in ps]
    single_inputs, single_lengths = batch([packed(questions[b], [p], gap=0) for b, p in singles])
    reference, _ = alone(single_inputs, lengths=single_lengths)
    # the reference's scores placed as the windows reader's: each paragraph's after the one
    # before it and a gap, "no answer" the best of the row's paragraphs'
    expected = torch.full_like(logits, float("-inf"))
    at = [1, 1]  # each row's next paragraph's first position (position 0: "no answer")
    nulls: dict[int, list[torch.Tensor]] = {0: [], 1: []}
    for k, (b, p) in enumerate(singles):
        expected[b, at[b] : at[b] + len(p)] = reference[k, 1 : 1 + len(p)]
        nulls[b].append(reference[k, 0])
        at[b] += len(p) + 1
    for b, candidates in nulls.items():
        expected[b, 0] = torch.stack(candidates).amax(dim=0)
    torch.testing.assert_close(logits, expected)
    assert torch.isinf(logits[0, 1 + 5]).all()  # the gap is padding
    torch.testing.assert_close(windows(inputs)[0], logits)  # lengths found past the gaps
    # backward: the gradients of any loss over the finite scores are the reference's
    weights = torch.randn(logits.shape, dtype=torch.float64, generator=generator)
    finite = torch.isfinite(logits)

    def loss(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return (scores.masked_fill(~mask, 0) * weights.masked_fill(~mask, 0)).sum()

    loss(logits, finite).backward()
    loss(expected, finite).backward()  # through the reference's weights
    for (name, mine), theirs in zip(windows.named_parameters(), alone.parameters(), strict=True):
        if theirs.grad is None:
            assert mine.grad is None or not mine.grad.any(), name
            continue
        torch.testing.assert_close(mine.grad, theirs.grad, msg=name)


def test_a_context_without_padding_is_one_window() -> None:
    generator = torch.Generator().manual_seed(2)
    inputs = packed(token(generator, 3), [token(generator, 7)], gap=0).unsqueeze(0)
    windows = reader("none", windows=True)
    joined = reader("none", windows=False)
    joined.load_state_dict(windows.state_dict())
    lengths = torch.tensor([inputs.shape[1]])
    torch.testing.assert_close(
        windows(inputs, lengths=lengths)[0], joined(inputs, lengths=lengths)[0]
    )


def test_windows_is_part_of_the_options_an_export_records() -> None:
    fields = {f.name: f.default for f in dataclasses.fields(ReaderOptions)}
    assert fields["windows"] is False  # exports from before it read as one pass
