"""BoxWorld (``docs/rl.md`` §1): the acceptance checks of spec §1.10 and the batched contract."""

from __future__ import annotations

import copy
import subprocess
import sys
from collections import deque

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import relmem.rl  # noqa: F401  (registers relmem/BoxWorld-v0)
from relmem.rl.envs.boxworld import (
    AGENT,
    BACKGROUND,
    BORDER,
    DISTRACTOR_LOCK,
    GEM,
    KEY,
    LOCK,
    PALETTE,
    BoxWorld,
    BoxWorldEnv,
    UnreachableDrawWarning,
    max_boxes,
)

PAPER = {"solution_length": (1, 2, 3, 4, 5), "num_forward": (0, 1, 2, 3, 4, 5)}  # §1.7
MOVES = ((-1, 0), (1, 0), (0, -1), (0, 1))  # actions 0..3


def check_level(env: BoxWorld, b: int) -> None:
    """§1.3's guarantees on instance ``b``'s freshly generated board."""
    n, level, board = env.grid_size, env.levels[b], env._map[b]
    L, f, k = level.solution_length, level.num_forward, level.num_backward
    assert (board == GEM).sum() == 1 and (board == AGENT).sum() == 1
    assert board[0, 0] == BORDER and (board[[0, -1]] == BORDER).all()
    assert (board[:, [0, -1]] == BORDER).all()
    locks = np.argwhere(board >= LOCK)
    assert len(locks) == L + f * env.branch_length + k
    left = board[locks[:, 0], locks[:, 1] - 1]
    assert (((left >= KEY) & (left < LOCK)) | (left == GEM)).all()  # content left of its lock
    objects = np.argwhere((board[1:-1, 1:-1] != BACKGROUND) & (board[1:-1, 1:-1] != AGENT)) + 1
    assert objects[:, 0].min() >= 2 and objects[:, 0].max() <= n - 1
    assert objects[:, 1].min() >= 2 and objects[:, 1].max() <= n - 2
    ay, ax = level.agent
    assert 2 <= ay <= n - 1 and 1 <= ax <= n - 1 and board[ay, ax] == AGENT
    # The level description matches the board.
    assert sorted(level.colours) == list(range(20))
    for index, ((lock_id, content_id), (y, x)) in enumerate(
        zip(level.pairs, level.positions, strict=True)
    ):
        content = GEM if content_id == -1 else KEY + level.colours[content_id - 1]
        assert board[y, x] == content
        if lock_id:
            first = DISTRACTOR_LOCK if index > L else LOCK
            assert board[y, x + 1] == first + level.colours[lock_id - 1]
        else:
            assert index == 0 and board[y, x + 1] < LOCK
    assert [pair[1] for pair in level.pairs[: L + 1]] == [*range(1, L + 1), -1]
    # The background (with the agent's cell) is 4-connected and touches every object.
    free = (board == BACKGROUND) | (board == AGENT)
    seen = reachable(free, level.agent)
    assert seen.sum() == free.sum()
    for y, x in objects:
        assert any(seen[y + dy, x + dx] for dy, dx in MOVES)


def reachable(free: np.ndarray, start: tuple[int, int]) -> np.ndarray:
    seen = np.zeros_like(free)
    seen[start] = True
    queue = deque([start])
    while queue:
        y, x = queue.popleft()
        for dy, dx in MOVES:
            if free[y + dy, x + dx] and not seen[y + dy, x + dx]:
                seen[y + dy, x + dx] = True
                queue.append((y + dy, x + dx))
    return seen


def path_to(grid: np.ndarray, start: tuple[int, int], goal: tuple[int, int]) -> list[int]:
    """Shortest actions from ``start`` through background cells, the last one into ``goal``."""
    parent = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            break
        for action, (dy, dx) in enumerate(MOVES):
            nxt = (cell[0] + dy, cell[1] + dx)
            if nxt not in parent and (nxt == goal or grid[nxt] == BACKGROUND):
                parent[nxt] = (cell, action)
                queue.append(nxt)
    actions = []
    while parent[goal] is not None:
        goal, action = parent[goal]
        actions.append(action)
    return actions[::-1]


def plan(env: BoxWorld, b: int, targets: list[tuple[int, int]]) -> list[int]:
    """Actions that walk instance ``b`` into each target cell in turn (BFS between them)."""
    grid, position, actions = env._map[b].copy(), env.levels[b].agent, []
    for target in targets:
        actions += path_to(grid, position, target)
        grid[position], grid[target], position = BACKGROUND, AGENT, target
    return actions


def solution_targets(level, boxes: int) -> list[tuple[int, int]]:
    """The loose key, then lock and content of the first ``boxes`` solution boxes."""
    targets = [level.positions[0]]
    for y, x in level.positions[1 : boxes + 1]:
        targets += [(y, x + 1), (y, x)]
    return targets


def play(env: BoxWorld, plans: list[list[int]]):
    """Play each instance's plan once (instances that finish are reset and ignored);
    per instance: return, steps, terminated, truncated."""
    B = env.batch_size
    total, steps = np.zeros(B), np.zeros(B, dtype=int)
    terminated, truncated, finished = (np.zeros(B, dtype=bool) for _ in range(3))
    for t in range(max(map(len, plans))):
        actions = np.array([p[t] if t < len(p) else 0 for p in plans])
        result = env.step(actions)
        live = ~finished
        total[live] += result.reward[live]
        steps[live] += 1
        terminated |= live & result.terminated
        truncated |= live & result.truncated
        finished |= result.terminated | result.truncated
        if (result.terminated | result.truncated).any():
            env.reset(result.terminated | result.truncated)
        if finished.all():
            break
    return total, steps, terminated, truncated


def generate(batch: int, seed: int, **options) -> BoxWorld:
    env = BoxWorld(batch, seed=seed, **options)
    env.reset()
    return env


@pytest.mark.parametrize("options", [{}, PAPER, {"grid_size": 8, "num_backward": (0, 1, 2)}])
def test_generation_invariants(options):
    env = generate(150, 0, **options)
    for b in range(env.batch_size):
        check_level(env, b)


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [{}, PAPER, {"grid_size": 8, "solution_length": (1, 2), "num_forward": (0, 1)}],
)
def test_generation_invariants_10000(options):
    for seed in range(10):
        env = generate(1000, seed, **options)
        for b in range(env.batch_size):
            check_level(env, b)


def solve_and_check(env: BoxWorld) -> None:
    plans = [
        plan(env, b, solution_targets(lv, lv.solution_length)) for b, lv in enumerate(env.levels)
    ]
    lengths = np.array([lv.solution_length for lv in env.levels])
    total, steps, terminated, truncated = play(env, plans)
    assert (total == lengths + 10).all() and terminated.all() and not truncated.any()
    assert (steps == [len(p) for p in plans]).all() and steps.max() <= env.max_steps


@pytest.mark.parametrize("options", [{}, PAPER, {"solution_length": 5, "num_forward": 5}])
def test_scripted_solver_returns_l_plus_10(options):
    env = generate(100, 1, **options)
    assert env.info()["solved"].sum() == 0
    solve_and_check(env)


@pytest.mark.slow
def test_scripted_solver_10000():
    for seed in range(10):
        solve_and_check(generate(1000, seed, **PAPER))


def test_forward_distractor_gives_minus_one_and_terminates():
    env = generate(100, 2, solution_length=(1, 2, 3), num_forward=(1, 2), branch_length=2)
    plans, expected = [], []
    for b, level in enumerate(env.levels):
        L = level.solution_length
        branch = L + 1 + env.branch_length * (b % level.num_forward)  # first box of a branch
        root = level.pairs[branch][0]  # a path key opens it
        y, x = level.positions[branch]
        plans.append(plan(env, b, [*solution_targets(level, root - 1), (y, x + 1)]))
        expected.append(root - 1 - 1)
    total, _, terminated, truncated = play(env, plans)
    assert (total == expected).all() and terminated.all() and not truncated.any()


def test_one_key_held():
    env = generate(1, 0, grid_size=8, solution_length=1, num_forward=0)
    board = env._map[0]
    board[board != BORDER] = BACKGROUND
    board[4, 2], board[4, 3], board[4, 4] = AGENT, KEY + 3, KEY + 7
    env._position[0] = (4, 2)
    for held in (3, 7):
        result = env.step(np.array([3]))
        assert result.reward[0] == 0 and board[0, 0] == KEY + held
    assert ((board >= KEY) & (board < LOCK)).sum() == 1  # the first key is destroyed
    assert (result.observation[0, 0, 0] == PALETTE[KEY + 7]).all()


def test_blocked_moves_and_locked_content():
    env = generate(1, 0, grid_size=8, solution_length=1, num_forward=0)
    board = env._map[0]
    board[board != BORDER] = BACKGROUND
    board[1, 1] = AGENT
    board[2, 1], board[2, 2] = KEY + 5, LOCK + 5  # a locked key below the agent
    env._position[0] = (1, 1)
    for action in (0, 2, 1):  # border, border, locked key
        result = env.step(np.array([action]))
        assert tuple(env._position[0]) == (1, 1) and result.reward[0] == 0


@pytest.mark.parametrize("observation", ["full", "viewport"])
def test_fast_step_equals_reference(observation):
    options = {"grid_size": 6, "solution_length": 1, "num_forward": 0, "observation": observation}
    fast, slow = BoxWorld(64, seed=3, **options), BoxWorld(64, seed=3, **options)
    fast.reset(), slow.reset()
    rng = np.random.default_rng(0)
    rewards = []
    for _ in range(300):
        actions = rng.integers(0, 4, 64)
        a, b = fast.step(actions), slow.step_reference(actions)
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(fast._board, slow._board)
        np.testing.assert_array_equal(fast._held, slow._held)
        if observation == "full":  # the incremental image equals a fresh palette lookup
            np.testing.assert_array_equal(a.observation, PALETTE[fast._map])
        else:
            padded = np.pad(PALETTE[fast._map], ((0, 0), (2, 2), (2, 2), (0, 0)))
            for i, (y, x) in enumerate(fast._position):
                np.testing.assert_array_equal(
                    a.observation[i, ..., :3], padded[i, y : y + 5, x : x + 5]
                )
                np.testing.assert_array_equal(
                    a.observation[i, ..., 3:],
                    np.broadcast_to(PALETTE[fast._map[i, 0, 0]], (5, 5, 3)),
                )
        rewards.append(a.reward)
        done = a.terminated | a.truncated
        if done.any():
            fast.reset(done), slow.reset(done)
    assert {0.0, 1.0, 10.0} <= set(np.concatenate(rewards).tolist())


def test_seeding():
    a, b = generate(4, 7), generate(8, 7)
    assert a.levels == b.levels[:4]  # one generator per instance, spawned from the seed
    assert generate(4, 8).levels != a.levels
    c = BoxWorld(4, seed=7)  # the order of partial resets does not matter
    c.reset(np.array([False, False, True, False]))
    c.reset(np.array([True, True, False, True]))
    assert c.levels == a.levels
    a.reset(np.array([True, False, False, False]))
    c.reset(np.array([True, False, False, False]))
    assert a.levels[0] == c.levels[0] and a.levels[0] != b.levels[0]
    np.testing.assert_array_equal(a._board, c._board)


@pytest.mark.parametrize(
    "options",
    [
        {"grid_size": 6, "solution_length": (1, 2), "num_forward": (0, 1)},  # the cpu preset
        PAPER,
        {"grid_size": 8, "solution_length": (1, 2, 3), "num_backward": (0, 1, 2)},
        {"grid_size": 10, "solution_length": (1, 2, 3), "num_forward": (0, 2), "branch_length": 2},
        {"grid_size": 5, "solution_length": (1, 2), "num_forward": (0, 1)},  # mostly failures
    ],
)
@pytest.mark.filterwarnings("ignore:BoxWorld. with grid_size")
def test_generation_equals_the_reference_attempt(options):
    """The fast attempt makes the reference's draws: the same levels and boards, and every
    generator left in the same state, failed attempts included."""
    fast, slow = BoxWorld(32, seed=11, **options), BoxWorld(32, seed=11, **options)
    slow._attempt = slow._attempt_reference
    for mask in (None, np.arange(32) % 3 == 0, None):
        fast.reset(mask), slow.reset(mask)
        assert fast.levels == slow.levels
        np.testing.assert_array_equal(fast._board, slow._board)
        for a, b in zip(fast.generators, slow.generators, strict=True):
            assert a.bit_generator.state == b.bit_generator.state
    assert fast.info()["retries"].sum() == slow.info()["retries"].sum()


def run_random(env: BoxWorld, steps: int, rng: np.random.Generator) -> list:
    """Random steps, resetting finished instances; the step results."""
    results = []
    for _ in range(steps):
        results.append(env.step(rng.integers(0, 4, env.batch_size)))
        done = results[-1].terminated | results[-1].truncated
        if done.any():
            env.reset(done)
    return results


def test_state_dict_round_trip():
    a = generate(16, 5)
    run_random(a, 50, np.random.default_rng(1))
    state = copy.deepcopy(a.state_dict())
    b = BoxWorld(16, seed=99)
    b.load_state_dict(state)
    assert b.levels == a.levels and (b.info()["retries"] == a.info()["retries"]).all()
    first = run_random(a, 200, np.random.default_rng(2))
    second = run_random(b, 200, np.random.default_rng(2))
    for x, y in zip(first, second, strict=True):
        for u, v in zip(x, y, strict=True):
            np.testing.assert_array_equal(u, v)
    with pytest.raises(ValueError, match="the state is from"):
        BoxWorld(16, grid_size=10).load_state_dict(state)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"grid_size": 4}, "grid_size must be an integer >= 5, got 4"),
        ({"grid_size": 12.0}, "grid_size must be an integer >= 5"),
        ({"solution_length": 0}, "solution_length must be an integer >= 1 or a non-empty"),
        ({"solution_length": ()}, "solution_length must be an integer >= 1 or a non-empty"),
        ({"solution_length": "3"}, "solution_length must be an integer >= 1 or a non-empty"),
        ({"solution_length": (1, True)}, "solution_length must be an integer >= 1, got True"),
        ({"num_forward": -1}, "num_forward must be an integer >= 0"),
        ({"num_backward": (0, -2)}, "num_backward must be an integer >= 0, got -2"),
        ({"branch_length": 0}, "branch_length must be an integer >= 1"),
        ({"max_steps": 0}, "max_steps must be an integer >= 1"),
        ({"observation": "pixels"}, "observation must be one of 'full', 'viewport', got 'pixels'"),
        ({"solution_length": 20}, r"solution_length must fit on the grid.* may be 1\.\.14"),
        (
            {"grid_size": 6, "solution_length": 2},
            r"at most 2 items fit.* may be 1\.\.1, got \(2,\)",
        ),
        ({"grid_size": 40, "solution_length": 19}, "solution_length must be <= 18"),
        (  # was an IndexError at reset: no key colour left for the 21st box
            {"grid_size": 30, "solution_length": 21, "num_forward": 0},
            r"solution_length must be <= 20 \(one key colour per box",
        ),
    ],
)
def test_bad_arguments(options, message):
    with pytest.raises(ValueError, match=message):
        BoxWorld(2, **options)
    with pytest.raises(ValueError, match=message):
        gym.make("relmem/BoxWorld-v0", **options)


def test_bad_calls():
    env = BoxWorld(2, seed=0)
    with pytest.raises(RuntimeError, match=r"instances \[0, 1\] have no episode under way"):
        env.step(np.array([0, 0]))
    env.reset()
    with pytest.raises(ValueError, match="actions must lie in 0..3"):
        env.step(np.array([0, 4]))
    env._steps[1] = env.max_steps - 1
    result = env.step(np.array([0, 0]))
    assert result.truncated.tolist() == [False, True] and not result.terminated.any()
    with pytest.raises(RuntimeError, match=r"instances \[1\] have no episode under way"):
        env.step(np.array([0, 0]))
    with pytest.raises(ValueError, match="render_mode must be one of"):
        BoxWorldEnv(render_mode="human")


def test_unfit_values_warn_once_per_process():
    """A run builds several environments with the same options: each message shows once per
    process (a fresh interpreter), and a filter that makes it an error still raises."""
    script = (  # three call sites, as in a run (Python's default filter shows one per site)
        "import warnings\n"
        "from relmem.rl.envs.boxworld import BoxWorld\n"
        "options = dict(grid_size=6, solution_length=(1, 2), num_forward=(0, 1))\n"
        "BoxWorld(4, seed=0, **options)\n"
        "BoxWorld(4, seed=1, **options)\n"
        "with warnings.catch_warnings():\n"  # as libraries do: it resets the per-site records
        "    pass\n"
        "BoxWorld(4, seed=2, **options)\n"
        "BoxWorld(4, seed=0, grid_size=6, solution_length=(1, 3))\n"
    )
    shown = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stderr
    assert shown.count("UnreachableDrawWarning") == 2, shown  # one per distinct message
    assert shown.count("num_forward [1] can never") == 1, shown
    errors = subprocess.run(
        [sys.executable, "-W", "error::UserWarning", "-c", script], capture_output=True, text=True
    )
    assert errors.returncode != 0 and "UnreachableDrawWarning" in errors.stderr


def test_unfit_values_warn_and_are_retried(monkeypatch):
    monkeypatch.setattr("relmem.rl.envs.boxworld._ISSUED", set())  # as in a fresh process
    with pytest.warns(
        UnreachableDrawWarning, match=r"solution_length \[2\], num_forward \[1\] can never"
    ):
        env = generate(200, 0, grid_size=6, solution_length=(1, 2), num_forward=(0, 1))
    info = env.info()
    assert (info["solution_length"] == 1).all() and (info["num_forward"] == 0).all()
    assert (
        info["retries"].max() > 0 and (info["retries"] == [lv.retries for lv in env.levels]).all()
    )


def brute_force_boxes(n: int) -> int:
    """The most items placeable under §1.3's rule: a loose key first, then locked boxes."""
    cells = [(y, x) for y in range(2, n) for x in range(2, n - 2)]

    def fits(a, b, loose):  # b placed after a
        return abs(a[0] - b[0]) >= 2 or b[1] >= a[1] + (2 if loose else 3) or b[1] <= a[1] - 3

    def most(chosen, start):
        best = len(chosen)
        for i in range(start, len(cells)):
            if all(fits(c, cells[i], j == 0) for j, c in enumerate(chosen)):
                best = max(best, most([*chosen, cells[i]], i + 1))
        return best

    return max(most([key], 0) for key in cells)


@pytest.mark.parametrize("n", [5, 6, 7, 8])
def test_max_boxes_is_exact(n):
    assert max_boxes(n) == brute_force_boxes(n)


def random_policy(episodes: int, seed: int, **options) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each instance's first episode under a uniform random policy: solved, solved within 60
    steps, opened a distractor."""
    env = generate(episodes, seed, max_steps=120, **options)
    rng = np.random.default_rng(seed + 1000)
    solved, early, wrong = (np.zeros(episodes, dtype=bool) for _ in range(3))
    live = np.ones(episodes, dtype=bool)
    for t in range(120):
        result = env.step(rng.integers(0, 4, episodes))
        solved |= live & (result.reward == 10)
        early |= live & (result.reward == 10) & (t < 60)
        wrong |= live & (result.reward == -1)
        done = result.terminated | result.truncated
        live &= ~done
        if done.any() and t < 119:
            env.reset(done)
    return solved, early, wrong


def within_3_se(observed: np.ndarray, reported: float, reported_n: int = 3000) -> bool:
    se = np.sqrt(reported * (1 - reported) * (1 / len(observed) + 1 / reported_n))
    return abs(observed.mean() - reported) <= 3 * se


RANDOM_TABLE = [  # §1.8: options, solved within 60, within 120, opened a distractor
    ({"grid_size": 6, "solution_length": 1, "num_forward": 0}, 0.127, 0.350, None),
    ({"grid_size": 8, "solution_length": 1, "num_forward": 0}, 0.038, 0.136, None),
    ({"grid_size": 8, "solution_length": (1, 2), "num_forward": (0, 1)}, 0.022, 0.071, None),
    ({}, 0.002, 0.005, 0.047),
    (PAPER, 0.002, 0.004, 0.054),
]


def check_random_row(options, within_60, within_120, distractor, episodes):
    solved, early, wrong = random_policy(episodes, 11, **options)
    assert within_3_se(early, within_60) and within_3_se(solved, within_120)
    if distractor is not None:
        assert within_3_se(wrong, distractor)


@pytest.mark.parametrize(("row", "episodes"), [(0, 1000), (3, 3000)])
def test_random_policy(row, episodes):
    check_random_row(*RANDOM_TABLE[row], episodes=episodes)


@pytest.mark.slow
@pytest.mark.parametrize("row", RANDOM_TABLE)
def test_random_policy_table(row):
    check_random_row(*row, episodes=3000)


@pytest.mark.parametrize("observation", ["full", "viewport"])
def test_gymnasium_env(observation):
    env = gym.make("relmem/BoxWorld-v0", observation=observation, render_mode="rgb_array")
    assert isinstance(env.unwrapped, BoxWorldEnv)
    check_env(env.unwrapped)
    observation_, info = env.reset(seed=3)
    assert observation_.shape == ((14, 14, 3) if observation == "full" else (5, 5, 6))
    assert set(info) >= {"retries", "solved", "solution_length", "num_forward"}
    assert env.render().shape == (14, 14, 3)
