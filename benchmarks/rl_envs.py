"""Environment steps per second of the batched RL games on one CPU thread (``docs/rl.md``).

Each game has a function here that builds its batched numpy core; :func:`steps_per_second`
plays it under a uniform random policy (actions drawn before the clock starts), resetting the
instances whose episodes ended, and counts ``batch_size`` environment steps per call of
``step``. The median of ``--repeats`` timed rounds is reported. One JSON object per game, with
machine info (load average included: other processes share the machine), is appended to
``--out`` and a line is printed.

    PYTHONPATH=src python benchmarks/rl_envs.py --games minipacman
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from relmem.env_info import machine_info
from relmem.rl.envs.base import BatchedEnv
from relmem.rl.envs.minipacman import MiniPacman

RESULTS = Path(__file__).parent / "results" / "rl_envs.jsonl"


def steps_per_second(env: BatchedEnv, steps: int, repeats: int, seed: int) -> list[float]:
    """Environment steps per second in each of ``repeats`` rounds of ``steps`` batched steps
    (random actions; ended instances are reset inside the timed loop)."""
    rng = np.random.default_rng(seed)
    env.reset()
    ended = np.zeros(env.batch_size, dtype=bool)
    rates = []
    for _ in range(repeats):
        actions = rng.integers(env.num_actions, size=(steps, env.batch_size))
        start = time.perf_counter()
        for action in actions:
            if ended.any():
                env.reset(ended)
            result = env.step(action)
            ended = result.terminated | result.truncated
        rates.append(steps * env.batch_size / (time.perf_counter() - start))
    return rates


def minipacman(args: argparse.Namespace) -> tuple[BatchedEnv, dict]:
    """Mini PacMan, task ``regular`` (``docs/rl.md`` §2)."""
    env = MiniPacman(args.batch_size, seed=args.seed, observation=args.observation)
    return env, {"task": "regular", "observation": args.observation}


GAMES: dict[str, Callable[[argparse.Namespace], tuple[BatchedEnv, dict]]] = {
    "minipacman": minipacman,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", nargs="+", choices=sorted(GAMES), default=sorted(GAMES))
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--observation", choices=("full", "viewport"), default="full")
    parser.add_argument("--steps", type=int, default=500, help="batched steps per round")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for game in args.games:
        env, settings = GAMES[game](args)
        rates = steps_per_second(env, args.steps, args.repeats, args.seed)
        record = {
            "game": game,
            "batch_size": args.batch_size,
            **settings,
            "steps_per_round": args.steps,
            "median_steps_per_s": statistics.median(rates),
            "steps_per_s": rates,
            **machine_info(torch.device("cpu")),
        }
        with args.out.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        print(
            f"{game} ({settings}) batch {args.batch_size}: "
            f"{record['median_steps_per_s']:,.0f} environment steps/s "
            f"(load average {record['load_average']})"
        )


if __name__ == "__main__":
    main()
