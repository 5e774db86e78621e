"""``ReaderOptions.dense_connections`` (``--task.no-dense-connections``): MemoReader's dense
connection ``g_t = [r_t; p_t]`` in every dense block, and its ablation ``g_t = r_t``. Each block
is checked against its parts, token by token, with and without the connection; the readers
built either way against each other, and the option from the command line to the model."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_reader import reference_window_attention

from relmem.models.reader import CoreMemory, DenseBlock, Reader, ReaderOptions
from relmem.tasks.reading.task import ReadingConfig

HIDDEN = 3


@pytest.mark.parametrize("dense", [True, False])
def test_the_block_attends_over_its_gru_output_with_or_without_its_input(dense: bool) -> None:
    torch.manual_seed(0)
    block = DenseBlock(5, HIDDEN, window=4, dropout=0.0, dense=dense).double()
    x = torch.randn(2, 9, 5, dtype=torch.float64)
    lengths = torch.tensor([9, 6])
    mask = torch.arange(9) < lengths.unsqueeze(1)
    out = block(x, lengths)

    p = torch.relu(block.project(x)) * mask.unsqueeze(-1)
    r = block.rnn(p, lengths)
    g = torch.cat([r, p], dim=-1) if dense else r
    attended = reference_window_attention(g, mask, 4, block.score)
    assert block.output_size == (6 if dense else 4) * HIDDEN
    assert out.shape == (2, 9, block.output_size)
    torch.testing.assert_close(out, torch.cat([r, attended], dim=-1))


def test_without_the_connection_the_attention_never_sees_the_projection() -> None:
    """The ablated block's attention part changes only through ``r``: with the GRU's weights
    zeroed ``r`` is a constant, so the output cannot move with the input at all; with the
    connection it does."""
    torch.manual_seed(0)
    x = torch.randn(1, 6, 5, dtype=torch.float64)
    lengths = torch.tensor([6])
    moved = {}
    for dense in (True, False):
        block = DenseBlock(5, HIDDEN, window=4, dropout=0.0, dense=dense).double()
        with torch.no_grad():
            for gru in (block.rnn.forward_gru, block.rnn.backward_gru):
                for weight in gru.parameters():
                    weight.zero_()
        moved[dense] = (block(x, lengths) - block(2 * x, lengths)).abs().max().item()
    assert moved[True] > 1e-3
    assert moved[False] == 0.0


def options(**changes) -> ReaderOptions:
    base = ReaderOptions(
        vocab_size=30, char_vocab_size=12, question_block=4, chars=3, word_size=6,
        char_embedding=4, char_channels=5, char_kernel=3, hidden_size=HIDDEN,
        attention_window=4, dropout=0.0,
    )  # fmt: skip
    return dataclasses.replace(base, **changes)


def test_a_reader_without_the_connections_has_narrower_blocks_and_trains() -> None:
    torch.manual_seed(0)
    dense, ablated = Reader(options(), []), Reader(options(dense_connections=False), [])
    assert dense.encode.output_size == 6 * HIDDEN and ablated.encode.output_size == 4 * HIDDEN
    count = {name: sum(p.numel() for p in m.parameters()) for name, m in
             (("dense", dense), ("ablated", ablated))}  # fmt: skip
    assert count["ablated"] < count["dense"]
    inputs = torch.zeros(2, 10, 6, dtype=torch.int32)
    inputs[:, :3, 0] = torch.tensor([5, 6, 7])
    inputs[:, 4:, 0] = torch.randint(2, 30, (2, 6))
    inputs[:, 4:, 3:] = torch.randint(1, 12, (2, 6, 3))
    logits, _ = ablated(inputs, lengths=torch.tensor([10, 8]))
    assert logits.shape == (2, 7, 2)
    logits[:, 1:5].sum().backward()
    assert ablated.encode.score.w_xy.grad is not None
    assert ablated.encode.score.w_xy.shape == (2 * HIDDEN,)


def test_the_memorys_pre_encoder_follows_the_option() -> None:
    core = torch.nn.GRU(2 * HIDDEN, 2 * HIDDEN, batch_first=True)
    core.output_size = 2 * HIDDEN
    memory = CoreMemory(2 * HIDDEN, options(dense_connections=False), core)
    assert memory.pre.block.dense is False
    assert memory.pre.block.output_size == 4 * HIDDEN


def test_the_command_line_option_reaches_the_reader() -> None:
    assert ReaderOptions.dense_connections is True  # exports from before it read as dense
    config = ReadingConfig(dense_connections=False)
    vocabulary = type("V", (), {"size": 30, "char_size": 12})()
    assert config.options(vocabulary, no_answer=False).dense_connections is False
    assert ReadingConfig().options(vocabulary, no_answer=False).dense_connections is True
