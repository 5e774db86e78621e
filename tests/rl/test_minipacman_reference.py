"""The batched Mini PacMan against a plain one-instance reference written from ``docs/rl.md``
§2 rule by rule (Python lists and loops, no vectorisation), on the same generators."""

from __future__ import annotations

import math

import numpy as np
import pytest

from relmem.rl.envs.minipacman import MAZE, TASKS, MiniPacman

H, W = len(MAZE), len(MAZE[0])
FREE = [(r, c) for r in range(H) for c in range(W) if MAZE[r][c] == "."]  # row-major
STEPS = [(0, 1), (-1, 0), (0, -1), (1, 0)]  # right, up, left, down
R, U, L, D = range(4)


def is_free(r: int, c: int) -> bool:
    return 0 <= r < H and 0 <= c < W and MAZE[r][c] == "."


def moved(cell: tuple[int, int], direction: int) -> tuple[int, int]:
    r, c = cell[0] + STEPS[direction][0], cell[1] + STEPS[direction][1]
    return (r, c) if is_free(r, c) else cell


class Reference:
    """One Mini PacMan game, the slow way."""

    def __init__(self, generator, task="regular", pill_duration=20, level_timer=None,
                 double=False, swap=False, bar=False) -> None:  # fmt: skip
        self.g, self.rules = generator, TASKS[task]
        self.duration, self.double, self.swap, self.bar = pill_duration, double, swap, bar
        self.timer_limit = self.rules.level_timer if level_timer is None else level_timer
        self.stochasticity = 0.05

    def init_level(self, level: int) -> None:
        self.food = set(FREE)
        self.pills = [FREE[i] for i in self.g.integers(len(FREE), size=2)]
        self.pac = FREE[self.g.integers(len(FREE))]
        pr, pc = self.pac
        rows = range(max(pr - 5, 1), min(pr + 5, H))
        cols = range(max(pc - 5, 1), min(pc + 5, W))
        spawn = [(r, c) for (r, c) in FREE if not (r in rows and c in cols)]
        self.ghosts = []
        for _ in range(1 + (level - 1) // 2):
            cell = spawn[self.g.integers(len(spawn))]
            self.ghosts.append([cell, int(self.g.integers(4))])
        self.power, self.level, self.timer = 0, level, 0

    def reset(self) -> None:
        self.frame = 0
        self.init_level(1)

    def eat(self) -> bool:
        """Food then at most one pill under Pacman; True if a new level started."""
        rules = self.rules
        new_level = False
        if self.pac in self.food:
            self.food.discard(self.pac)
            self.reward += rules.food
            if not self.food and rules.clear_on_food:
                self.init_level(self.level + 1)
                new_level = True
        if self.pac in self.pills:
            self.pills.remove(self.pac)
            self.reward += rules.pill
            self.power = self.duration
            if not self.pills and rules.clear_on_pills:
                self.init_level(self.level + 1)
                new_level = True
        return new_level

    def turn(self, ghost) -> None:
        cell, d = ghost
        ways = [k for k in range(4) if moved(cell, k) != cell]
        back = (d + 2) % 4
        if len(ways) == 1:
            ghost[1] = ways[0]
        elif len(ways) == 2:
            if d not in ways:
                ghost[1] = [k for k in ways if k != back][0]
        else:
            ways = [k for k in ways if k != back]
            u = (self.pac[0] - cell[0], self.pac[1] - cell[1])
            if u != (0, 0):
                scores = [u[0] * STEPS[k][0] + u[1] * STEPS[k][1] for k in ways]
                if self.power == 0:
                    if self.g.random() < self.stochasticity:
                        ghost[1] = ways[self.g.integers(len(ways))]
                    else:
                        ghost[1] = ways[scores.index(max(scores))]
                else:
                    ghost[1] = ways[scores.index(min(scores))]

    def meet(self, i: int) -> bool:
        """Ghost i meets Pacman; True if it was eaten (stop the ghosts)."""
        if self.power == 0:
            self.reward += self.rules.death
            self.killed = True
            return False
        self.ghosts.pop(i)
        self.reward += self.rules.ghost
        if not self.ghosts and self.rules.clear_on_ghosts:
            self.init_level(self.level + 1)
        return True

    def step(self, action: int):
        self.frame += 1
        self.timer += 1
        self.reward = self.rules.step
        self.killed = False
        self.power = max(0, self.power - 1)
        double = self.double and self.power > 0
        if action:
            self.pac = moved(self.pac, action - 1)
        new_level = self.eat()
        passed = None
        if double and not new_level:
            passed = self.pac
            if action:
                self.pac = moved(self.pac, action - 1)
            self.eat()
            if passed == self.pac or not self.swap:
                passed = None
        for i, ghost in enumerate(self.ghosts):
            if ghost[0] in (self.pac, passed) and self.meet(i):
                break
            speed = (0.5 + 0.1 * (self.level - 1)) * (0.5 if self.power > 0 else 1.0)
            if self.g.random() < speed:
                self.turn(ghost)
                ghost[0] = moved(ghost[0], ghost[1])
                if ghost[0] == self.pac and self.meet(i):
                    break
        if self.timer == self.timer_limit:
            self.init_level(self.level + 1)
        truncated = self.frame >= 3000 and not self.killed
        return self.image(), self.reward, self.killed, truncated

    def image(self) -> np.ndarray:
        out = np.zeros((H, W, 3), dtype=np.uint8)
        for r in range(H):
            for c in range(W):
                ghost = any(g[0] == (r, c) for g in self.ghosts)
                if (r, c) == self.pac:
                    out[r, c] = (0, 255, 0)
                elif ghost:
                    out[r, c] = (255, math.floor(255 * self.power / self.duration + 0.5), 0)
                elif (r, c) in self.pills:
                    out[r, c] = (0, 255, 255)
                elif (r, c) in self.food:
                    out[r, c] = (0, 0, 255)
                elif self.bar and r == H - 1 and c < min(self.power, W):
                    out[r, c] = (255, 255, 0)
                elif not is_free(r, c):
                    out[r, c] = (255, 255, 255)
        return out


OPTIONS = {
    "regular": {},
    "avoid": {},
    "hunt": {},
    "ambush": {},
    "rush": {},
    "regular+options": {
        "pacman_double_speed": True,
        "collide_on_swap": True,
        "power_bar": True,
        "pill_duration": 19,
    },
    "hunt+timer": {"level_timer": 30, "pacman_double_speed": True, "collide_on_swap": True},
}


@pytest.mark.parametrize("case", list(OPTIONS))
def test_batched_steps_equal_the_reference(case) -> None:
    task, options = case.split("+")[0], OPTIONS[case]
    batch, steps = 6, 250
    env = MiniPacman(batch, seed=17, task=task, **options)
    references = []
    for generator in env.generators:
        copy = np.random.Generator(np.random.PCG64())
        copy.bit_generator.state = generator.bit_generator.state
        references.append(
            Reference(copy, task, options.get("pill_duration", 20), options.get("level_timer"),
                      options.get("pacman_double_speed", False),
                      options.get("collide_on_swap", False), options.get("power_bar", False))
        )  # fmt: skip
    rng = np.random.default_rng(0)
    observation = env.reset()
    for b, reference in enumerate(references):
        reference.reset()
        np.testing.assert_array_equal(observation[b], reference.image())
    # crowd some instances with ghosts around Pacman (one on its cell, two sharing a cell),
    # powered or not, to reach the rarer paths: ghosts eaten, the stop after one, two deaths
    ghosts = (((3, 5), U), ((3, 6), L), ((3, 4), R), ((2, 5), D), ((4, 5), U), ((3, 6), R))
    full = options.get("pill_duration", 20)
    for b, power, level in ((0, full, 9), (2, 0, 9), (4, 16, 16)):
        env.place(b, pacman=(3, 5), ghosts=ghosts, pills=((3, 7), (5, 5)), power=power, level=level)
        reference = references[b]
        reference.pac, reference.ghosts = (3, 5), [[cell, d] for cell, d in ghosts]
        reference.pills, reference.food = [(3, 7), (5, 5)], set(FREE)
        reference.power, reference.level, reference.timer, reference.frame = power, level, 0, 0
    for _ in range(steps):
        actions = rng.integers(5, size=batch)
        result = env.step(actions)
        for b, reference in enumerate(references):
            image, reward, terminated, truncated = reference.step(int(actions[b]))
            np.testing.assert_array_equal(result.observation[b], image)
            assert result.reward[b] == pytest.approx(reward, abs=1e-5)
            assert (result.terminated[b], result.truncated[b]) == (terminated, truncated)
            assert env.info()["level"][b] == reference.level
        ended = result.terminated | result.truncated
        if ended.any():
            env.reset(ended)
            for b in np.flatnonzero(ended):
                references[b].reset()
