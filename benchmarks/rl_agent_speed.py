"""The RL agent's compute per batch on one CPU thread (``docs/rl.md`` §3): collection and loss.

For each shape (``cpu``: the ``boxworld`` ``cpu`` preset's full-observation level, grid_size 6
-> ``[8, 8, 3]``, RMC 2 memories x 2 heads x 32 with the 'memory' gate, LSTM 128, ConvLSTM 64;
``paper``: the viewport ``[5, 5, 6]`` with the paper's RMC 4 x 4 x 64, LSTM 256, ConvLSTM 64)
and each core it times, side by side in one process:

- ``collect_ms``: one sequential-mode step of ``agent.policy`` on ``[B]`` entries, no
  gradient (what a collector runs per environment step);
- ``loss_ms``: ``agent.policy`` and the value head in recurrent mode on ``[B, T]`` entries,
  then the backward of a weighted sum of the logits and values (what a PPO / V-trace update
  runs per minibatch), for each ``recurrent_impl`` (``'steps'``, the reference loop, and
  ``'segments'``) and, for the RMC, each core implementation (``'fast'``, ``'fused'``,
  ``'reference'``).

Episodes are packed along T as in collected data: ``is_init`` starts each row at t = 0 and is
set at each later step with probability ``1 / episode_length`` (fixed seed); the number of
segments the ``'segments'`` implementation runs is recorded. Each figure is the minimum over
``--repeats`` timed calls after two warm-up calls. One JSON object per measurement, with machine
info (load included), is appended to ``--out`` and a line per measurement printed.

    PYTHONPATH=src python benchmarks/rl_agent_speed.py
    PYTHONPATH=src python benchmarks/rl_agent_speed.py --shapes cpu --models rmc --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict
from torchrl.modules import set_recurrent_mode

from relmem.env_info import machine_info
from relmem.models import LSTMModelConfig, RMCModelConfig
from relmem.models.convlstm import ConvLSTMModelConfig
from relmem.rl import keys
from relmem.rl.agent import Agent, build_agent

SHAPES: dict[str, dict[str, Any]] = {
    "cpu": {
        "observation": (8, 8, 3),
        "rmc": RMCModelConfig(mem_slots=2, head_size=32, num_heads=2, gate_style="memory"),
        "lstm": LSTMModelConfig(hidden_size=128),
        "convlstm": ConvLSTMModelConfig(),
    },
    "paper": {
        "observation": (5, 5, 6),
        "rmc": RMCModelConfig(mem_slots=4, head_size=64, num_heads=4, gate_style="memory"),
        "lstm": LSTMModelConfig(hidden_size=256),
        "convlstm": ConvLSTMModelConfig(),
    },
}
NUM_ACTIONS = 4


def best_ms(fn: Callable[[], object], repeats: int) -> float:
    """The fastest of ``repeats`` calls after two warm-up calls, in milliseconds."""
    fn(), fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


def batch_of(
    agent: Agent, observation: tuple[int, ...], shape: tuple[int, ...], episode_length: float
) -> TensorDict:
    """Random observations and states of batch shape ``shape`` (``[B]`` or ``[B, T]``); with
    a time dimension, episodes start at t = 0 and w.p. ``1 / episode_length`` at each step."""
    generator = torch.Generator().manual_seed(0)
    starts = torch.rand(*shape, generator=generator) < 1 / episode_length
    if len(shape) == 2:
        starts[:, 0] = True
    entries = {
        keys.OBSERVATION: torch.randint(0, 256, (*shape, *observation), generator=generator).to(
            torch.uint8
        ),
        keys.IS_INIT: starts.unsqueeze(-1),
    }
    for key, size in zip(agent.state_keys, agent.core.state_shapes, strict=True):
        entries[key] = torch.randn(*shape, *size, generator=generator)
    return TensorDict(entries, batch_size=list(shape))


def measure(
    shape_name: str, model: str, batch: int, steps: int, episode_length: float, repeats: int
) -> list[dict[str, Any]]:
    """Every timing of one agent."""
    spec = SHAPES[shape_name]
    torch.manual_seed(0)
    agent = build_agent(spec["observation"], NUM_ACTIONS, model, spec[model])
    one = batch_of(agent, spec["observation"], (batch,), episode_length)
    sequence = batch_of(agent, spec["observation"], (batch, steps), episode_length)
    starts = sequence[keys.IS_INIT][..., 0]
    segments = 1 + int(starts[:, 1:].any(0).sum())
    weights = torch.randn(batch, steps, NUM_ACTIONS + 1, generator=torch.Generator().manual_seed(1))

    def collect() -> None:
        with torch.no_grad():
            agent.policy(one.clone())

    def loss() -> None:
        td = sequence.clone()
        with set_recurrent_mode(True):
            agent.policy(td)
            agent.value_head(td)
        out = torch.cat([td[keys.LOGITS], td[keys.STATE_VALUE]], -1)
        (out * weights).sum().backward()

    implementations = ["fast", "fused", "reference"] if model == "rmc" else [None]
    rows = []
    base = {"shape": shape_name, "model": model, "batch": batch, "steps": steps}
    base |= {"observation": list(spec["observation"]), "episode_length": episode_length}
    for implementation in implementations:
        if implementation is not None:
            agent.core.core.implementation = implementation
            agent.core.core.cell.implementation = implementation
        row = {**base, "core_implementation": implementation}
        rows.append({**row, "what": "collect_ms", "ms": best_ms(collect, 5 * repeats)})
        for impl in ("steps", "segments"):
            agent.core.recurrent_impl = impl
            extra = {"recurrent_impl": impl, "segments": segments if impl == "segments" else steps}
            rows.append({**row, **extra, "what": "loss_ms", "ms": best_ms(loss, repeats)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=sorted(SHAPES))
    parser.add_argument(
        "--models",
        nargs="+",
        choices=["rmc", "lstm", "convlstm"],
        default=["rmc", "lstm", "convlstm"],
    )
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20, help="T of the loss's [B, T] batch")
    parser.add_argument(
        "--episode-lengths",
        type=float,
        nargs="+",
        default=[10.0, 50.0],
        help="mean episode length of the packed episodes (a reset per step w.p. 1/length)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "rl" / "agent_speed.jsonl"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    info = {"device": "cpu", **machine_info(torch.device("cpu"))}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(f"{info['cpu']}, load average {info['load_average']}", flush=True)
    with args.out.open("a") as out:
        for shape in args.shapes:
            for length in args.episode_lengths:
                for model in args.models:
                    for row in measure(shape, model, args.batch, args.steps, length, args.repeats):
                        out.write(json.dumps({**row, **info}) + "\n")
                        detail = row.get("recurrent_impl") or ""
                        if row.get("recurrent_impl"):
                            detail += f" ({row['segments']} calls)"
                        print(
                            f"{shape} L={length:g} {model} {row['core_implementation'] or ''} "
                            f"{row['what']} {detail}: {row['ms']:.1f} ms",
                            flush=True,
                        )
    print(f"load average after: {list(os.getloadavg())}")


if __name__ == "__main__":
    main()
