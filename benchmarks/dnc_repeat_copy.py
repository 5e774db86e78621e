"""Train a DNC (or an LSTM baseline) on repeat copy on the CPU and log the bit error.

The CPU preset (the defaults here) is ``deepmind/dnc``'s repeat-copy task and model sizes
(spec section 14: 4 bits, pattern lengths 1–2, repeats 1–2, batch 16; controller 64, N = 16,
W = 16, R = 4, Wh = 1, clip 20, global-norm clipping 50), with one deliberate change so it
learns within minutes: Adam with lr 1e-3 instead of RMSProp 1e-4 (deepmind needs ~10⁵ steps).
The LSTM baseline is an ``nn.LSTM`` with the same hidden size plus a linear read-out. The
task options (``--max-length`` etc.) make harder variants of the same task.

Every ``--log-every`` steps a JSON line (step, seconds, mean loss and bit error per sequence
over the last window) goes to stdout and to ``--out``.

    PYTHONPATH=src python benchmarks/dnc_repeat_copy.py --model dnc --minutes 10
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from pathlib import Path

import torch
from torch import nn

from relmem import DNC
from relmem.tasks import RepeatCopy, bit_errors, masked_sigmoid_cross_entropy


class LSTMBaseline(nn.Module):
    """``nn.LSTM`` + linear read-out, ``[T, B, X] -> [T, B, Y]``."""

    def __init__(self, input_size: int, hidden_size: int, output_size: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(input_size, hidden_size)
        self.readout = nn.Linear(hidden_size, output_size)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.readout(self.lstm(x)[0])


def build(model: str, task: RepeatCopy, hidden: int) -> nn.Module:
    if model == "lstm":
        return LSTMBaseline(task.input_size, hidden, task.target_size)
    return DNC(
        task.input_size,
        hidden,
        memory_size=16,
        word_size=16,
        num_read_heads=4,
        num_write_heads=1,
        output_size=task.target_size,
        clip_value=20.0,
    )


def git_sha() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["dnc", "lstm"], default="dnc")
    parser.add_argument("--steps", type=int, default=100_000, help="at most this many updates")
    parser.add_argument("--minutes", type=float, default=10.0, help="wall-clock budget")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--log-every", type=int, default=250)
    parser.add_argument("--out", type=Path, default=None)
    task_defaults = RepeatCopy()
    for field in ("num_bits", "min_length", "max_length", "min_repeats", "max_repeats"):
        parser.add_argument(
            "--" + field.replace("_", "-"),
            type=int,
            default=getattr(task_defaults, field),
            help="task option (default: deepmind train.py's)",
        )
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    task = RepeatCopy(
        args.num_bits, args.min_length, args.max_length, args.min_repeats, args.max_repeats
    )
    model = build(args.model, task, args.hidden)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    out = args.out or Path(__file__).parent / "results" / f"repeat_copy_{args.model}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    header = {
        "kind": "header",
        "model": args.model,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "task": task.__dict__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "git_sha": git_sha(),
    }
    with out.open("w") as log:
        log.write(json.dumps(header) + "\n")
        print(json.dumps(header), flush=True)
        start = time.perf_counter()
        window_loss, window_bits, window_n = 0.0, 0.0, 0
        for step in range(1, args.steps + 1):
            batch = task.sample(args.batch_size, generator=generator)
            if args.model == "dnc":
                logits, _ = model(batch.inputs, lengths=batch.lengths)
            else:
                logits = model(batch.inputs, batch.lengths)
            loss = masked_sigmoid_cross_entropy(logits, batch.targets, batch.mask)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 50.0)
            optimizer.step()
            window_loss += loss.item()
            window_bits += bit_errors(logits.detach(), batch.targets, batch.mask).mean().item()
            window_n += 1
            elapsed = time.perf_counter() - start
            done = elapsed > 60 * args.minutes or step == args.steps
            if step % args.log_every == 0 or done:
                record = {
                    "step": step,
                    "seconds": round(elapsed, 1),
                    "loss": window_loss / window_n,
                    "bit_error_per_sequence": window_bits / window_n,
                }
                log.write(json.dumps(record) + "\n")
                log.flush()
                print(json.dumps(record), flush=True)
                window_loss, window_bits, window_n = 0.0, 0.0, 0
            if done:
                break


if __name__ == "__main__":
    main()
