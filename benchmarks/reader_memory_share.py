"""What the memory costs MemoReader's reader: one training step with and without it, and the
memory's dense pre-encoder alone, on one thread.

The reader is the ``squad`` ``cpu`` preset's, built on ``--file`` split by article as
``relmem train squad --task.train-file FILE --task.held-out-articles 0.2`` splits it; the
batches are ``--batches`` training batches of its 32 questions (one seeded draw, the same for
both readers). Each step is forward, the task's loss and backward; each figure is the fastest of
``--repeat`` rounds, the readers taking turns on every batch. The memory module of the ``dnc``
reader (``DNCMemory``: the dense pre-encoder, a ``DenseBlock`` as the reader's own encoder, then
the memory controller layer) is the difference between the two; its pre-encoder is timed alone on
the first batch's fused document. Prints one JSON object.

    python benchmarks/reader_memory_share.py --file train-v1.1.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch

from relmem.tasks import get_preset, get_task
from relmem.train.runs import build_model


def seconds(step, *args) -> float:
    """The wall time of one call of ``step(*args)``."""
    start = time.perf_counter()
    step(*args)
    return time.perf_counter() - start


def cpu_readers(file: Path) -> tuple[Any, Any, dict[str, torch.nn.Module]]:
    """The ``squad`` ``cpu`` preset's config and task on ``file`` split by article (20% held
    out), and its ``none`` and ``dnc`` readers in training mode, each built from seed 0:
    ``(config, task, {name: reader})``. Also :mod:`reader_parts`'s."""
    config = get_preset("squad", "cpu")
    config.task.train_file, config.task.held_out_articles = file, 0.2
    task = get_task("squad").build(config.task)
    readers = {}
    for name in ("none", "dnc"):
        config.model = name
        torch.manual_seed(0)
        readers[name] = build_model(config, task).train()
    return config, task, readers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--file", type=Path, required=True, help="a SQuAD-layout train file")
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    config, task, readers = cpu_readers(args.file)
    generator = torch.Generator().manual_seed(0)
    batches = [task.sample(config.batch_size, generator) for _ in range(args.batches)]
    memory = readers["dnc"].memory[0]
    seen: list = []
    hook = memory.register_forward_hook(lambda m, i, o: seen.append(i) if not seen else None)

    def step(name: str, batch) -> None:
        logits, _ = readers[name](batch.inputs, None, lengths=batch.lengths)
        task.loss(logits, batch).backward()

    best = {(name, k): float("inf") for name in readers for k in range(len(batches))}
    for _ in range(args.repeat):
        for k, batch in enumerate(batches):
            for name in readers:
                best[name, k] = min(best[name, k], seconds(step, name, batch))
    hook.remove()
    document, lengths = seen[0][0].detach(), seen[0][1]

    def pre_encoder() -> None:
        x = document.clone().requires_grad_(True)
        memory.pre.lengths = lengths
        try:
            memory.pre(x).sum().backward()
        finally:
            memory.pre.lengths = None

    pre = min(seconds(pre_encoder) for _ in range(args.repeat))
    none_first, dnc_first = best["none", 0], best["dnc", 0]
    total = {name: sum(best[name, k] for k in range(len(batches))) for name in readers}
    print(json.dumps({
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "load_average": os.getloadavg(),
        "batches": [list(b.inputs.shape[:2]) for b in batches],
        "step_s": {name: [best[name, k] for k in range(len(batches))] for name in readers},
        "questions_per_s": {n: config.batch_size * len(batches) / t for n, t in total.items()},
        "dnc_speed_over_none": total["none"] / total["dnc"],
        "first_batch": {"none_s": none_first, "dnc_s": dnc_first, "pre_encoder_s": pre,
                        "memory_module_s": dnc_first - none_first,
                        "pre_encoder_share_of_memory": pre / (dnc_first - none_first),
                        "bound_with_free_controller": none_first / (none_first + pre)},
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
