"""BoxWorld (``docs/rl.md`` §1): DeepMind's pycolab rules, batched in numpy.

The board of every instance is an ``int8`` grid of cell codes (:data:`BACKGROUND`,
:data:`BORDER`, :data:`AGENT`, :data:`GEM`, ``KEY + colour``, ``LOCK + colour`` for a solution
lock, ``DISTRACTOR_LOCK + colour`` for a distractor's lock); :data:`PALETTE` turns codes into
RGB. Levels are generated per instance in Python on :meth:`BoxWorld.reset` (§1.3); one
:meth:`BoxWorld.step` moves every instance at once with array operations (§1.4), and the full
observation is updated in place, cell by cell, rather than redrawn.
:meth:`BoxWorld.step_reference` is the per-instance oracle of :meth:`BoxWorld.step`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from relmem.rl.envs.base import BatchedEnv, StepResult
from relmem.rl.envs.gym_env import BatchedGymEnv
from relmem.validation import check_choice, check_int

__all__ = ["BoxWorld", "BoxWorldEnv", "Level", "PALETTE", "UnreachableDrawWarning", "max_boxes"]

NUM_COLOURS = 20  # key/lock colours (docs/rl.md §1.2)
BACKGROUND, BORDER, AGENT, GEM = 0, 1, 2, 3
KEY = 4  # KEY + c: a key of colour c
LOCK = KEY + NUM_COLOURS  # LOCK + c: the lock of a solution box
DISTRACTOR_LOCK = LOCK + NUM_COLOURS  # DISTRACTOR_LOCK + c: the lock of a distractor box
NUM_CODES = DISTRACTOR_LOCK + NUM_COLOURS
PAD = 2  # border cells around the map, so that a 5x5 viewport never leaves the array

_COLOURS_999 = [
    (700, 350, 350), (700, 454, 350), (700, 559, 350), (700, 664, 350), (629, 700, 350),
    (524, 700, 350), (420, 700, 350), (350, 700, 384), (350, 700, 490), (350, 700, 595),
    (350, 700, 700), (350, 594, 700), (350, 490, 700), (350, 384, 700), (419, 350, 700),
    (524, 350, 700), (630, 350, 700), (700, 350, 665), (700, 350, 559), (700, 350, 455),
]  # fmt: skip


def _palette() -> np.ndarray:
    """``uint8 [NUM_CODES, 3]``: the RGB of every cell code, ``round(v * 255 / 999)`` of
    pycolab's 0-999 colours (§1.2)."""
    special = {BACKGROUND: (800, 800, 800), BORDER: (0, 0, 0), AGENT: (500, 500, 500)}
    special[GEM] = (999, 999, 999)
    table = np.zeros((NUM_CODES, 3))
    for code, colour in special.items():
        table[code] = colour
    for first in (KEY, LOCK, DISTRACTOR_LOCK):
        table[first : first + NUM_COLOURS] = _COLOURS_999
    return np.round(table * 255 / 999).astype(np.uint8)


PALETTE = _palette()
# Actions 0 up, 1 down, 2 left, 3 right (§1.4).
_DY = np.array([-1, 1, 0, 0], dtype=np.int64)
_DX = np.array([0, 0, -1, 1], dtype=np.int64)
_WINDOW = np.arange(-2, 3)  # viewport offsets (§1.6)
_MAX_FAILURES = 200  # placement failures per attempt, and failed attempts per level (§1.3)


class _PlacementDraws:
    """Pairs ``(rng.integers(0, bound_x), rng.integers(0, bound_y))``, at most ``pairs`` of
    them, drawn ahead in one call; :meth:`settle` leaves ``rng`` where one scalar call per
    number taken would have left it (an array of bounds draws the same values as one call per
    element, in order)."""

    def __init__(self, rng: np.random.Generator, bound_x: int, bound_y: int, pairs: int) -> None:
        self.rng, self.state = rng, rng.bit_generator.state
        self.bounds = np.tile(np.array([bound_x, bound_y], dtype=np.int64), pairs)
        self.values = rng.integers(0, self.bounds).tolist()
        self.taken = 0

    def next(self) -> tuple[int, int]:
        i = self.taken
        self.taken = i + 2
        return self.values[i], self.values[i + 1]

    def settle(self) -> None:
        self.rng.bit_generator.state = self.state
        if self.taken:
            self.rng.integers(0, self.bounds[: self.taken])


def max_boxes(grid_size: int) -> int:
    """The most items (boxes and the loose key) §1.3's placement rule can ever fit on an
    ``n x n`` interior.

    Contents lie in rows ``2..n-1`` and columns ``2..n-3``; an item placed later must keep its
    3x4 block clear of earlier items, so two items in rows at most 1 apart sit at least 3
    columns apart (2 after the loose first key, which has no lock). Rows pair up into
    ``ceil((n-2)/2)`` groups of ``ceil((n-4)/3)`` items, plus one when the loose key's saved
    column makes room for another box.
    """
    columns = grid_size - 4
    return -(-(grid_size - 2) // 2) * -(-columns // 3) + (columns % 3 == 0)


@dataclass(frozen=True)
class Level:
    """One generated level (§1.3), in map coordinates ``(y, x)``, border included.

    Attributes:
        solution_length: L, the boxes on the path to the gem.
        num_forward: f, the forward distractor branches.
        num_backward: k, the backward distractors.
        pairs: ``(lock_id, content_id)`` per item in placement order (§1.3 step 2: the loose
            key, the L solution boxes, then the distractors); ``lock_id`` 0: no lock,
            ``content_id`` -1: the gem.
        colours: the palette index of abstract key id ``j`` is ``colours[j - 1]``.
        positions: the content cell of each item (its lock, if any, is one cell right).
        agent: the agent's start cell.
        retries: failed generation attempts before this level.
    """

    solution_length: int
    num_forward: int
    num_backward: int
    pairs: tuple[tuple[int, int], ...]
    colours: tuple[int, ...]
    positions: tuple[tuple[int, int], ...]
    agent: tuple[int, int]
    retries: int

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> Level:
        """The inverse of ``dataclasses.asdict`` (lists, as from JSON, become tuples)."""
        return cls(
            **{
                **state,
                "pairs": tuple(tuple(pair) for pair in state["pairs"]),
                "colours": tuple(state["colours"]),
                "positions": tuple(tuple(cell) for cell in state["positions"]),
                "agent": tuple(state["agent"]),
            }
        )


def _choices(name: str, value: Any, minimum: int, owner: str) -> tuple[int, ...]:
    """An int or a non-empty sequence of ints ``>= minimum``, as a tuple to draw from."""
    items = value if isinstance(value, Sequence) and not isinstance(value, str) else None
    if items is None or len(items) == 0:
        if isinstance(value, int) and not isinstance(value, bool) and value >= minimum:
            return (value,)
        raise ValueError(
            f"{owner}: {name} must be an integer >= {minimum} or a non-empty sequence of "
            f"them, got {value!r}"
        )
    return tuple(check_int(name, item, minimum, owner=owner) for item in items)


class UnreachableDrawWarning(UserWarning):
    """Values of a BoxWorld parameter that no level on the grid can hold (such draws are
    retried, so they never appear)."""


# The UnreachableDrawWarning messages this process has issued: a run builds several
# environments with the same options (a probe, the training batch, the held-out levels), and
# each would repeat it. (A "once" filter would not do: CPython keys it by the calling module.)
_ISSUED: set[str] = set()


class BoxWorld(BatchedEnv):
    """``batch_size`` BoxWorld instances (``docs/rl.md`` §1).

    Args:
        batch_size: B.
        seed: seed of the per-instance generators.
        grid_size: n, the interior size (the map is ``(n+2) x (n+2)`` with its border).
        solution_length: L, an int or a sequence to draw from uniformly per level.
        num_forward: forward distractor branches, an int or a sequence to draw from.
        num_backward: backward distractors, an int or a sequence to draw from.
        branch_length: boxes per forward distractor branch.
        max_steps: an episode is truncated after exactly this many steps (§1.5).
        observation: ``'full'``, the map as ``uint8 [n+2, n+2, 3]`` with the held key in cell
            ``(0, 0)``; ``'viewport'``, the 5x5 window centred on the agent (black outside the
            map) and a 5x5 frame of the held key's colour, ``uint8 [5, 5, 6]`` (§1.6).

    Raises:
        ValueError: an argument has the wrong type or range, or no level could ever fit on
            the grid (the smallest L, f and k together need more than :func:`max_boxes`).

    Attributes:
        levels: the current :class:`Level` of each instance (None before its first reset).

    Values of ``solution_length``, ``num_forward`` or ``num_backward`` that can never fit are
    redrawn like any failed attempt, as pycolab does (§1.3 step 6): a ``UserWarning`` names
    them, and ``info()['retries']`` counts the failed attempts of every level.
    """

    num_actions = 4

    def __init__(
        self,
        batch_size: int,
        seed: int | None = None,
        *,
        grid_size: int = 12,
        solution_length: int | Sequence[int] = (1, 2, 3, 4),
        num_forward: int | Sequence[int] = (0, 1, 2, 3, 4),
        num_backward: int | Sequence[int] = (0,),
        branch_length: int = 1,
        max_steps: int = 120,
        observation: str = "full",
    ) -> None:
        owner = type(self).__name__
        self.grid_size = check_int("grid_size", grid_size, 5, owner=owner)
        self.solution_length = _choices("solution_length", solution_length, 1, owner)
        self.num_forward = _choices("num_forward", num_forward, 0, owner)
        self.num_backward = _choices("num_backward", num_backward, 0, owner)
        self.branch_length = check_int("branch_length", branch_length, 1, owner=owner)
        self.max_steps = check_int("max_steps", max_steps, 1, owner=owner)
        self.observation = check_choice(
            "observation", observation, ("full", "viewport"), owner=owner
        )
        self._check_fits(owner)
        size = self.grid_size + 2
        self.observation_shape = (size, size, 3) if observation == "full" else (5, 5, 6)
        super().__init__(batch_size, seed)
        B = self.batch_size
        self._board = np.full((B, size + 2 * PAD, size + 2 * PAD), BORDER, dtype=np.int8)
        self._map = self._board[:, PAD:-PAD, PAD:-PAD]  # [B, n+2, n+2], a view
        self._position = np.zeros((B, 2), dtype=np.int64)  # agent (y, x), map coordinates
        self._held = np.full(B, -1, dtype=np.int64)  # colour of the held key, -1: none
        self._steps = np.zeros(B, dtype=np.int64)
        self._done = np.ones(B, dtype=bool)  # no episode under way until reset
        self._solved = np.zeros(B, dtype=bool)
        self._counters = np.zeros((4, B), dtype=np.int64)  # retries, L, f, k
        self._obs = np.zeros((B, size, size, 3), dtype=np.uint8)  # the full image ("full" only)
        self._rows = np.arange(B)
        self.levels: list[Level | None] = [None] * B
        # [y][x]: whether a fresh map's 3x4 block at rows y-1..y+1, columns x-1..x+2 is all
        # background (the placement test of _attempt_reference), as lists: _attempt copies it
        empty = np.full((size, size), BORDER, dtype=np.int8)
        empty[1:-1, 1:-1] = BACKGROUND
        self._clear_blocks = [
            [
                1 <= y <= size - 2
                and 1 <= x <= size - 3
                and not empty[y - 1 : y + 2, x - 1 : x + 3].any()
                for x in range(size)
            ]
            for y in range(size)
        ]

    def _check_fits(self, owner: str) -> None:
        """Raise if no level fits on the grid or the key ids run out; warn about values that
        can never be drawn into a level."""
        room = max_boxes(self.grid_size)
        least = {
            "solution_length": min(self.solution_length) + 1,
            "num_forward": min(self.num_forward) * self.branch_length,
            "num_backward": min(self.num_backward),
        }
        if sum(least.values()) > room:
            largest = room - 1 - least["num_forward"] - least["num_backward"]
            allowed = f"1..{largest}" if largest >= 1 else "none (grow grid_size)"
            raise ValueError(
                f"{owner}: solution_length must fit on the grid: with grid_size="
                f"{self.grid_size} at most {room} items fit (the loose key and the boxes), so "
                f"with num_forward >= {min(self.num_forward)} and num_backward >= "
                f"{min(self.num_backward)} solution_length may be {allowed}, got "
                f"{self.solution_length}"
            )
        if max(self.solution_length) > NUM_COLOURS:
            raise ValueError(
                f"{owner}: solution_length must be <= {NUM_COLOURS} (one key colour per box on "
                f"the path), got {self.solution_length}"
            )
        for name, values in (
            ("num_forward", self.num_forward),
            ("num_backward", self.num_backward),
        ):
            if max(values) > 0 and max(self.solution_length) > 18:
                raise ValueError(
                    f"{owner}: solution_length must be <= 18 when {name} > 0 (distractor keys "
                    f"need ids L+1..19), got {self.solution_length}"
                )
        if max(self.num_forward) > 0 and self.branch_length > 1 and max(self.solution_length) > 17:
            raise ValueError(
                f"{owner}: solution_length must be <= 17 when branch_length > 1 and "
                f"num_forward > 0, got {self.solution_length}"
            )
        per_item = {"solution_length": 1, "num_forward": self.branch_length, "num_backward": 1}
        dropped = {}
        for name, values in (
            ("solution_length", self.solution_length),
            ("num_forward", self.num_forward),
            ("num_backward", self.num_backward),
        ):
            others = sum(least.values()) - least[name]
            base = 1 if name == "solution_length" else 0
            never = sorted({v for v in values if others + base + v * per_item[name] > room})
            if never:
                dropped[name] = never
        if dropped:
            shown = ", ".join(f"{name} {values}" for name, values in dropped.items())
            message = (
                f"{owner}: with grid_size={self.grid_size} at most {room} items fit, so "
                f"{shown} can never be drawn into a level (such draws are retried; see "
                "info()['retries'])"
            )
            if message not in _ISSUED:
                warnings.warn(message, UnreachableDrawWarning, stacklevel=3)
                _ISSUED.add(message)  # after: a filter that raises it raises every time

    # ----- level generation (§1.3), one instance at a time -----

    def _sample_problem(self, rng: np.random.Generator) -> tuple[int, int, int, list]:
        """§1.3 steps 1-2: L, f, k and the ``(lock_id, content_id)`` list."""
        L, f, k = (
            values[int(rng.integers(len(values)))]
            for values in (self.solution_length, self.num_forward, self.num_backward)
        )
        pairs = [(i, i + 1) for i in range(L)] + [(L, -1)]
        for _ in range(f):
            lock = int(rng.integers(1, L + 1))
            for _ in range(self.branch_length):
                content = lock
                while content == lock:
                    content = int(rng.integers(L + 1, NUM_COLOURS))
                pairs.append((lock, content))
                lock = content
        for _ in range(k):
            content = int(rng.integers(1, L + 1))
            pairs.append((int(rng.integers(L + 1, NUM_COLOURS)), content))
        return L, f, k, pairs

    def _attempt(self, rng: np.random.Generator, board: np.ndarray, retries: int):
        """:meth:`_attempt_reference` with its placement draws made ahead in one call each and
        its 3x4-block test read from a table kept up to date as items are placed: the same
        draws, level and generator state after, at about a twentieth of the cost (a failed
        attempt takes 201 draws and tests, and levels that cannot fit fail every time)."""
        n = self.grid_size
        L, f, k, pairs = self._sample_problem(rng)
        colours = rng.permutation(NUM_COLOURS)
        board.fill(BORDER)
        board[1:-1, 1:-1] = BACKGROUND
        clear = [row[:] for row in self._clear_blocks]  # [y][x]: the block at (y, x) is clear
        occupied = set()
        failures = 0
        positions = []
        draws = _PlacementDraws(rng, n - 3, n - 2, len(pairs) + _MAX_FAILURES + 1)
        for index, (lock_id, content_id) in enumerate(pairs):
            while True:
                if failures > _MAX_FAILURES:
                    draws.settle()
                    return None
                dx, dy = draws.next()
                x, y = 1 + dx, 2 + dy
                if clear[y][x]:
                    break
                failures += 1
            board[y, x] = GEM if content_id == -1 else KEY + colours[content_id - 1]
            cells = [(y, x)]
            if lock_id != 0:
                first = DISTRACTOR_LOCK if index > L else LOCK
                board[y, x + 1] = first + colours[lock_id - 1]
                cells.append((y, x + 1))
            for cy, cx in cells:
                occupied.add((cy, cx))
                # the blocks that hold the cell: rows by-1..by+1, columns bx-1..bx+2
                for by in range(cy - 1, cy + 2):
                    row = clear[by]
                    for bx in range(max(cx - 2, 0), cx + 2):
                        row[bx] = False
            positions.append((y, x))
        draws.settle()
        draws = _PlacementDraws(rng, n - 1, n - 2, _MAX_FAILURES - failures + 1)
        while True:
            if failures > _MAX_FAILURES:
                draws.settle()
                return None
            dx, dy = draws.next()
            x, y = 1 + dx, 2 + dy
            if (y, x) not in occupied:  # the interior is background but for the items
                break
            failures += 1
        draws.settle()
        board[y, x] = AGENT
        return Level(
            L, f, k, tuple(pairs), tuple(int(c) for c in colours), tuple(positions), (y, x), retries
        )

    def _attempt_reference(self, rng: np.random.Generator, board: np.ndarray, retries: int):
        """One generation attempt (§1.3 steps 1-5) on ``board`` (``int8 [n+2, n+2]``,
        overwritten); the :class:`Level`, or None when the placements failed 201 times.

        The rule as written, one draw and one board test at a time: the oracle of
        :meth:`_attempt`, which makes the same draws and the same level (tested)."""
        n = self.grid_size
        L, f, k, pairs = self._sample_problem(rng)
        colours = rng.permutation(NUM_COLOURS)
        board.fill(BORDER)
        board[1:-1, 1:-1] = BACKGROUND
        failures = 0
        positions = []
        for index, (lock_id, content_id) in enumerate(pairs):
            while True:
                if failures > _MAX_FAILURES:
                    return None
                x = 1 + int(rng.integers(0, n - 3))
                y = 2 + int(rng.integers(0, n - 2))
                if not board[y - 1 : y + 2, x - 1 : x + 3].any():  # BACKGROUND is 0
                    break
                failures += 1
            board[y, x] = GEM if content_id == -1 else KEY + colours[content_id - 1]
            if lock_id != 0:
                first = DISTRACTOR_LOCK if index > L else LOCK
                board[y, x + 1] = first + colours[lock_id - 1]
            positions.append((y, x))
        while True:
            if failures > _MAX_FAILURES:
                return None
            x = 1 + int(rng.integers(0, n - 1))
            y = 2 + int(rng.integers(0, n - 2))
            if board[y, x] == BACKGROUND:
                break
            failures += 1
        board[y, x] = AGENT
        return Level(
            L, f, k, tuple(pairs), tuple(int(c) for c in colours), tuple(positions), (y, x), retries
        )

    def _generate(self, index: int) -> None:
        """Draw instance ``index``'s next level into its board (§1.3 steps 6-7)."""
        board = self._map[index]
        for retries in range(_MAX_FAILURES):
            level = self._attempt(self.generators[index], board, retries)
            if level is not None:
                break
        else:
            raise RuntimeError(
                f"{type(self).__name__}: could not generate a level in {_MAX_FAILURES} "
                f"attempts (grid_size={self.grid_size}, solution_length="
                f"{self.solution_length}, num_forward={self.num_forward}, num_backward="
                f"{self.num_backward}); use a larger grid_size or smaller problems"
            )
        self.levels[index] = level
        self._position[index] = level.agent
        self._counters[:, index] = (
            level.retries,
            level.solution_length,
            level.num_forward,
            level.num_backward,
        )

    # ----- the BatchedEnv interface -----

    def reset(self, mask: np.ndarray | None = None) -> np.ndarray:
        """New levels where ``mask`` (None: all); ``uint8 [B, *observation_shape]`` of all."""
        mask = self._mask(mask)
        chosen = np.flatnonzero(mask)
        for index in chosen:
            self._generate(int(index))
        self._held[chosen] = -1
        self._steps[chosen] = 0
        self._done[chosen] = False
        self._solved[chosen] = False
        if self.observation == "full":
            self._obs[chosen] = PALETTE[self._map[chosen]]
        return self._observe()

    def _observe(self) -> np.ndarray:
        """The current observations, ``uint8 [B, *observation_shape]`` (a new array)."""
        if self.observation == "full":
            return self._obs.copy()
        side = self._board.shape[1]  # flat indices into the padded boards
        centre = (self._rows * side + self._position[:, 0] + PAD) * side + self._position[:, 1]
        window = (_WINDOW[:, None] * side + _WINDOW).reshape(-1)  # [25]
        cells = self._board.reshape(-1)[centre[:, None] + PAD + window]  # [B, 25]
        observation = np.empty((self.batch_size, 5, 5, 6), dtype=np.uint8)
        observation[..., :3] = PALETTE[cells].reshape(-1, 5, 5, 3)
        observation[..., 3:] = PALETTE[self._map[:, 0, 0]][:, None, None, :]  # held key
        return observation

    def _check_running(self) -> None:
        if self._done.any():
            raise RuntimeError(
                f"{type(self).__name__}: instances {np.flatnonzero(self._done).tolist()} have "
                "no episode under way (ended, or never reset); call reset(mask) for them first"
            )

    def step(self, actions: np.ndarray) -> StepResult:
        """One move of every instance (§1.4, vectorised); see :meth:`BatchedEnv.step`."""
        actions = self._actions(actions)
        self._check_running()
        rows, board = self._rows, self._board
        y, x = self._position[:, 0], self._position[:, 1]
        ty, tx = y + _DY[actions], x + _DX[actions]
        target = board[rows, ty + PAD, tx + PAD].astype(np.int64)  # [B]
        locked = board[rows, ty + PAD, tx + PAD + 1] >= LOCK  # a lock right of the target
        is_lock = target >= LOCK
        opens = is_lock & ((target - LOCK) % NUM_COLOURS == self._held)
        picks = (target >= KEY) & ~is_lock & ~locked
        gem = (target == GEM) & ~locked
        wrong = opens & (target >= DISTRACTOR_LOCK)
        moves = (target == BACKGROUND) | picks | gem | opens
        reward = (10.0 * gem + opens - 2.0 * wrong).astype(np.float32)
        self._held = np.where(picks, target - KEY, np.where(opens, -1, self._held))

        moved = rows[moves]
        board[moved, y[moves] + PAD, x[moves] + PAD] = BACKGROUND
        board[moved, ty[moves] + PAD, tx[moves] + PAD] = AGENT
        inventory = np.where(self._held >= 0, KEY + self._held, BORDER)
        board[:, PAD, PAD] = inventory
        if self.observation == "full":
            self._obs[moved, y[moves], x[moves]] = PALETTE[BACKGROUND]
            self._obs[moved, ty[moves], tx[moves]] = PALETTE[AGENT]
            self._obs[:, 0, 0] = PALETTE[inventory]
        self._position[moves, 0] = ty[moves]
        self._position[moves, 1] = tx[moves]
        return self._finish(reward, gem | wrong, gem)

    def _finish(self, reward: np.ndarray, terminated: np.ndarray, gem: np.ndarray) -> StepResult:
        """Count the step, end episodes (§1.5) and observe."""
        self._steps += 1
        truncated = (self._steps >= self.max_steps) & ~terminated
        self._done = terminated | truncated
        self._solved |= gem
        return StepResult(self._observe(), reward, terminated, truncated)

    def step_reference(self, actions: np.ndarray) -> StepResult:
        """:meth:`step` one instance at a time, following §1.4's table case by case (the slow
        oracle of the tests)."""
        actions = self._actions(actions)
        self._check_running()
        B = self.batch_size
        reward = np.zeros(B, dtype=np.float32)
        terminated, gem = np.zeros(B, dtype=bool), np.zeros(B, dtype=bool)
        for b in range(B):
            board = self._map[b]
            y, x = (int(v) for v in self._position[b])
            ty, tx = y + int(_DY[actions[b]]), x + int(_DX[actions[b]])
            code = int(board[ty, tx])
            right = int(board[ty, tx + 1]) if tx + 1 < board.shape[1] else BORDER
            if code == BORDER:
                continue
            if code >= LOCK:  # a lock: open it with the key of its colour
                if (code - LOCK) % NUM_COLOURS != self._held[b]:
                    continue
                self._held[b] = -1
                if code >= DISTRACTOR_LOCK:
                    reward[b], terminated[b] = -1.0, True
                else:
                    reward[b] = 1.0
            elif code != BACKGROUND and right >= LOCK:  # a locked key or gem
                continue
            elif code == GEM:
                reward[b], terminated[b], gem[b] = 10.0, True, True
            elif code >= KEY:  # a loose key replaces the held one
                self._held[b] = code - KEY
            board[y, x], board[ty, tx] = BACKGROUND, AGENT
            self._position[b] = (ty, tx)
        self._map[:, 0, 0] = np.where(self._held >= 0, KEY + self._held, BORDER)
        if self.observation == "full":
            self._obs[:] = PALETTE[self._map]
        return self._finish(reward, terminated, gem)

    def render(self, index: int = 0) -> np.ndarray:
        """Instance ``index``'s map as RGB, ``uint8 [n+2, n+2, 3]``."""
        return PALETTE[self._map[index]]

    def info(self) -> dict[str, np.ndarray]:
        """Per instance: ``retries`` (failed generation attempts before the current level),
        ``solved`` (the episode collected the gem), ``solution_length``, ``num_forward`` and
        ``num_backward`` of the current level."""
        retries, L, f, k = self._counters.copy()
        return {
            "retries": retries,
            "solved": self._solved.copy(),
            "solution_length": L,
            "num_forward": f,
            "num_backward": k,
        }

    def _config(self) -> dict[str, Any]:
        return {
            "grid_size": self.grid_size,
            "solution_length": list(self.solution_length),
            "num_forward": list(self.num_forward),
            "num_backward": list(self.num_backward),
            "branch_length": self.branch_length,
            "max_steps": self.max_steps,
            "observation": self.observation,
            "batch_size": self.batch_size,
        }

    def state_dict(self) -> dict[str, Any]:
        """Boards, agents, counters, levels and generator states (see
        :meth:`BatchedEnv.state_dict`)."""
        return {
            "game": type(self).__name__,
            "config": self._config(),
            "board": self._map.copy(),
            "position": self._position.copy(),
            "held": self._held.copy(),
            "steps": self._steps.copy(),
            "done": self._done.copy(),
            "solved": self._solved.copy(),
            "counters": self._counters.copy(),
            "levels": [None if level is None else asdict(level) for level in self.levels],
            "generators": [g.bit_generator.state for g in self.generators],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (see :meth:`BatchedEnv.load_state_dict`)."""
        name = type(self).__name__
        if state.get("game") != name or state.get("config") != self._config():
            raise ValueError(
                f"{name}: the state is from {state.get('game')!r} with {state.get('config')}, "
                f"not from this environment ({self._config()})"
            )
        self._map[:] = state["board"]
        self._position[:] = state["position"]
        self._held[:] = state["held"]
        self._steps[:] = state["steps"]
        self._done[:] = state["done"]
        self._solved[:] = state["solved"]
        self._counters[:] = state["counters"]
        self.levels = [None if lv is None else Level.from_dict(lv) for lv in state["levels"]]
        for generator, generator_state in zip(self.generators, state["generators"], strict=True):
            generator.bit_generator.state = generator_state
        if self.observation == "full":
            self._obs[:] = PALETTE[self._map]


class BoxWorldEnv(BatchedGymEnv):
    """BoxWorld as a Gymnasium environment (``relmem/BoxWorld-v0``); the keyword arguments
    are :class:`BoxWorld`'s, ``render_mode='rgb_array'`` renders the whole map."""

    core_class = BoxWorld
