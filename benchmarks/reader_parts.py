"""Where one training step of MemoReader's reader goes: each part forward + backward alone, on
one thread, at a real batch's shapes.

The reader is the ``squad`` ``cpu`` preset's ``dnc`` reader, built on ``--file`` split by
article as ``relmem train squad --task.train-file FILE --task.held-out-articles 0.2`` splits it;
the batch is its first training batch of 32 questions (seed 0). Each part reads the input the
part before it gave (detached) and backpropagates a gradient of ones: the token embedding of
the context, the context's and the question's dense blocks, the self-attention of the context's
block alone, one BiGRU, the co-attention, the span head, the memory module, its dense
pre-encoder, and the memory controller layer without it; then the whole step (forward, the
task's loss, backward) of the reader with and without the memory. Each figure is the median of
``--repeat`` calls after one to warm up. Run it against another checkout with
``PYTHONPATH=that/src`` to compare code side by side. Prints one JSON object.

    python benchmarks/reader_parts.py --file train-v1.1.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from reader_memory_share import cpu_readers  # benchmarks/reader_memory_share.py, beside this
from torch import Tensor

from relmem.models.reader import _lengths_mask, windowed_self_attention


def median_ms(call: Callable[[], None], repeat: int) -> float:
    """The median wall time of ``call()`` over ``repeat`` calls after one to warm up, in ms."""
    call()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def trained(part: Callable[..., Tensor | tuple], *inputs: Tensor) -> Callable[[], None]:
    """``part(*inputs)`` forward and backward (a gradient of ones), its inputs detached."""

    def call() -> None:
        xs = [x.detach().requires_grad_(x.is_floating_point()) for x in inputs]
        out = part(*xs)
        out = out[0] if isinstance(out, tuple) else out
        out.backward(torch.ones_like(out))

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--file", type=Path, required=True, help="a SQuAD-layout train file")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    config, task, readers = cpu_readers(args.file)
    batch = task.sample(config.batch_size, torch.Generator().manual_seed(0))
    reader = readers["dnc"]
    q = reader.options.question_block
    context_lengths = batch.lengths - q
    steps = int(context_lengths.max())
    question_lengths = (batch.inputs[:, :q, 0] != 0).sum(dim=1).clamp(min=1)
    question = batch.inputs[:, : int(question_lengths.max())].long()
    context = batch.inputs[:, q : q + steps].long()
    memory = reader.memory[0]
    c_mask = _lengths_mask(context_lengths, steps)
    q_mask = _lengths_mask(question_lengths, question.shape[1])
    with torch.no_grad():
        c_emb, q_emb = reader.embed(context), reader.embed(question)
        p = reader.encode.project(c_emb)
        g = torch.cat([reader.encode.rnn(p, context_lengths), p], dim=-1)
        c_enc = reader.encode(c_emb, context_lengths)
        q_enc = reader.encode(q_emb, question_lengths)
        d = reader.attend(c_enc, c_mask, q_enc, q_mask)
        memory.pre.lengths = context_lengths
        pre = memory.pre(d)
        memory.pre.lengths = None

    def pre_encoder(x: Tensor) -> Tensor:
        memory.pre.lengths = context_lengths
        try:
            return memory.pre(x)
        finally:
            memory.pre.lengths = None

    def controller_layer(x: Tensor) -> Tensor:
        memory.layer.pre_encoder = None  # x is already pre-encoded
        try:
            return memory.layer(x, lengths=context_lengths)[0]
        finally:
            memory.layer.pre_encoder = memory.pre

    def step(name: str) -> Callable[[], None]:
        def call() -> None:
            logits, _ = readers[name](batch.inputs, None, lengths=batch.lengths)
            task.loss(logits, batch).backward()

        return call

    block = reader.encode
    parts = {
        "token embedding, context": trained(lambda c: reader.embed(c), context),
        "dense block, context": trained(lambda x: block(x, context_lengths), c_emb),
        "  its self-attention": trained(
            lambda x: windowed_self_attention(x, c_mask, block.window, block.score), g
        ),
        "  its BiGRU": trained(lambda x: block.rnn(x, context_lengths), p),
        "dense block, question": trained(lambda x: block(x, question_lengths), q_emb),
        "co-attention": trained(lambda c, x: reader.attend(c, c_mask, x, q_mask), c_enc, q_enc),
        "span head": trained(lambda x: reader.head(x, context_lengths), d),
        "memory module": trained(lambda x: memory(x, context_lengths), d),
        "  its dense pre-encoder": trained(pre_encoder, d),
        "  the memory controller layer": trained(controller_layer, pre),
        "step, the reader without memory": step("none"),
        "step, the reader with the DNC memory": step("dnc"),
    }
    print(json.dumps({
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": 1,
        "load_average": os.getloadavg(),
        "batch": {"rows": len(context), "context": steps, "question": question.shape[1]},
        "median_ms": {name: median_ms(call, args.repeat) for name, call in parts.items()},
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
