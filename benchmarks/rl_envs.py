"""Environment steps per second of the batched RL games on one CPU thread (``docs/rl.md``).

Each game has a function that builds its batched numpy core (batch 256 by default), plays a
uniform random policy for ``--steps`` batched steps, resetting the instances whose episode
ended (as a collector does), and returns two figures in environment steps (instance-steps)
per second: ``steps_per_s``, the whole loop with the resets and their level generation, and
``step_only_per_s``, the time inside ``step`` alone. The games run in numpy, whose
element-wise operations use one thread; torch is not involved.

One JSON object per game, with machine info (load included), is appended to ``--out``
(``benchmarks/results/rl/env_speed.jsonl``) and a line per game is printed.

    PYTHONPATH=src python benchmarks/rl_envs.py
    PYTHONPATH=src python benchmarks/rl_envs.py --games boxworld --observation viewport
    PYTHONPATH=src python benchmarks/rl_envs.py --games minipacman
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from relmem.env_info import machine_info
from relmem.rl.envs.base import BatchedEnv
from relmem.rl.envs.boxworld import BoxWorld
from relmem.rl.envs.minipacman import MiniPacman


def play(env: BatchedEnv, steps: int, seed: int = 0) -> dict[str, float]:
    """Random actions for ``steps`` batched steps after a warm-up; steps per second with and
    without the resets."""
    rng = np.random.default_rng(seed)
    actions = rng.integers(0, env.num_actions, (steps + 20, env.batch_size))
    env.reset()
    in_step, episodes = 0.0, 0
    for index, action in enumerate(actions):
        if index == 20:  # warm-up done
            start, in_step, episodes = time.perf_counter(), 0.0, 0
        before = time.perf_counter()
        result = env.step(action)
        in_step += time.perf_counter() - before
        done = result.terminated | result.truncated
        if done.any():
            env.reset(done)
            episodes += int(done.sum())
    total = time.perf_counter() - start
    count = steps * env.batch_size
    return {
        "steps_per_s": count / total,
        "step_only_per_s": count / in_step,
        "episodes": episodes,
        "seconds": total,
    }


def boxworld(batch_size: int, steps: int, observation: str) -> dict[str, Any]:
    """BoxWorld at pycolab's default difficulty (n = 12, L in 1..4, f in 0..4)."""
    env = BoxWorld(batch_size, seed=0, observation=observation)
    return {"game": "boxworld", "grid_size": env.grid_size, **play(env, steps)}


def minipacman(batch_size: int, steps: int, observation: str) -> dict[str, Any]:
    """Mini PacMan, task 'regular' (``docs/rl.md`` §2)."""
    env = MiniPacman(batch_size, seed=0, task="regular", observation=observation)
    return {"game": "minipacman", "task": "regular", **play(env, steps)}


GAMES = {"boxworld": boxworld, "minipacman": minipacman}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", nargs="+", choices=sorted(GAMES), default=sorted(GAMES))
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=2000, help="batched steps timed")
    parser.add_argument("--observation", choices=["full", "viewport"], default="full")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "rl" / "env_speed.jsonl"
    )
    args = parser.parse_args()
    if args.steps < 1 or args.batch < 1:
        parser.error(f"--steps and --batch must be >= 1, got {args.steps} and {args.batch}")
    torch.set_num_threads(1)
    info = {"device": "cpu", **machine_info(torch.device("cpu"))}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as out:
        for game in args.games:
            row = GAMES[game](args.batch, args.steps, args.observation)
            row |= {"batch": args.batch, "observation": args.observation, "steps": args.steps}
            out.write(json.dumps({**row, **info}) + "\n")
            print(
                f"{game} ({args.observation}, batch {args.batch}): "
                f"{row['steps_per_s']:,.0f} steps/s with resets, "
                f"{row['step_only_per_s']:,.0f} in step() alone; {info['cpu']}, "
                f"load average {info['load_average']}",
                flush=True,
            )


if __name__ == "__main__":
    main()
