"""Mini PacMan (``docs/rl.md`` §2): DeepMind's PillEater rules, B instances stepped in numpy.

The maze is fixed (15 × 19 cells, 138 free); Pacman eats food and power pills, ghosts chase it
and flee while a pill is in effect. The rules, the step order (quirks included), the ghosts'
movement and the order of the random draws follow the reference implementation described in
``docs/rl.md`` §2; the few deliberate deviations are marked **[lib]** there and below.

Cells are flat indices ``row * 19 + col``. Directions are numbered right 0, up 1, left 2,
down 3; action ``a`` in 1..4 moves in direction ``a - 1`` and action 0 stays.

Tests and tools can put an instance into any state with :meth:`MiniPacman.place`, and force the
ghosts' random branch off by setting the instance attribute ``stochasticity`` to 0.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from relmem.rl.envs.base import BatchedEnv, StepResult
from relmem.rl.envs.gym_env import BatchedGymEnv
from relmem.validation import check_bool, check_choice, check_int

__all__ = ["MAZE", "MiniPacman", "MiniPacmanEnv", "TASKS"]

MAZE = (
    "###################",
    "#...#.........#...#",
    "#.#.#.#######.#.#.#",
    "#.................#",
    "#.#.#.#######.#.#.#",
    "#.#.............#.#",
    "#.####.#####.####.#",
    "#......#####......#",
    "#.####.#####.####.#",
    "#.#.............#.#",
    "#.#.#.#######.#.#.#",
    "#.................#",
    "#.#.#.#######.#.#.#",
    "#...#.........#...#",
    "###################",
)
"""The fixed layout (``docs/rl.md`` §2.1): ``#`` wall, ``.`` free."""

HEIGHT, WIDTH = len(MAZE), len(MAZE[0])
NUM_CELLS = HEIGHT * WIDTH
FREE = np.array([[c == "." for c in row] for row in MAZE]).reshape(-1)  # bool [285]
FREE_CELLS = np.flatnonzero(FREE)  # int [138]
STEPS = np.array([(0, 1), (-1, 0), (0, -1), (1, 0)])  # (row, col) of right, up, left, down
REVERSE = np.array([2, 3, 0, 1])  # the opposite direction


def _neighbours() -> np.ndarray:
    """``int [285, 5]``: the cell reached from each cell by each action (a wall blocks)."""
    table = np.repeat(np.arange(NUM_CELLS)[:, None], 5, axis=1)
    for cell in FREE_CELLS:
        row, col = divmod(int(cell), WIDTH)
        for d, (dr, dc) in enumerate(STEPS):
            target = (row + dr) * WIDTH + col + dc
            if FREE[target]:
                table[cell, d + 1] = target
    return table


NEXT = _neighbours()  # int [285, 5]
AVAILABLE = NEXT[:, 1:] != np.arange(NUM_CELLS)[:, None]  # bool [285, 4]: free neighbour
ROW, COL = np.divmod(np.arange(NUM_CELLS), WIDTH)  # int [285] each
SAFE_DISTANCE = 5
NUM_PILLS = 2


def _ghost_spawn_cells() -> list[np.ndarray]:
    """Per Pacman cell, the free cells outside the ghosts' exclusion box (``docs/rl.md``
    §2.3: rows ``max(r-5, 1) .. min(r+5, 15) - 1``, columns likewise; 5 before, 4 after)."""
    cells = []
    for r, c in zip(ROW, COL, strict=True):
        allowed = FREE.reshape(HEIGHT, WIDTH).copy()
        rows = slice(max(r - SAFE_DISTANCE, 1), min(r + SAFE_DISTANCE, HEIGHT))
        cols = slice(max(c - SAFE_DISTANCE, 1), min(c + SAFE_DISTANCE, WIDTH))
        allowed[rows, cols] = False
        cells.append(np.flatnonzero(allowed))
    return cells


SPAWN_CELLS = _ghost_spawn_cells()

VIEW = 5
_OUTSIDE = NUM_CELLS  # index of an extra wall pixel: what the viewport sees off the map


def _viewport_index() -> np.ndarray:
    """``int [285, 25]``: per centre cell, the 5 × 5 window's cells (``_OUTSIDE`` off the map)."""
    offsets = np.arange(VIEW) - VIEW // 2
    rows = ROW[:, None, None] + offsets[None, :, None]
    cols = COL[:, None, None] + offsets[None, None, :]
    inside = (rows >= 0) & (rows < HEIGHT) & (cols >= 0) & (cols < WIDTH)
    return np.where(inside, rows * WIDTH + cols, _OUTSIDE).reshape(NUM_CELLS, VIEW * VIEW)


VIEW_INDEX = _viewport_index()

_EMPTY, _WALL, _FOOD, _PILL, _GHOST, _PACMAN, _BAR = range(7)  # what a cell shows
_PALETTE = np.array(
    [(0, 0, 0), (255, 255, 255), (0, 0, 255), (0, 255, 255), (255, 0, 0), (0, 255, 0)]
    + [(255, 255, 0)],
    dtype=np.uint8,
)  # [7, 3] RGB per code: the ghost's green channel is set from the power
_BOARD_CODE = np.where(FREE, _EMPTY, _WALL)  # [285]
_POWER_BAR = np.arange(WIDTH) + (HEIGHT - 1) * WIDTH  # the bottom wall row's cells


class TaskRules(NamedTuple):
    """One task's rewards and level-clearing rules (``docs/rl.md`` §2.6)."""

    step: float
    food: float
    pill: float
    ghost: float
    death: float
    clear_on_food: bool
    clear_on_pills: bool
    clear_on_ghosts: bool
    level_timer: int  # steps on a level before the next starts; 0: none


TASKS: dict[str, TaskRules] = {
    "regular": TaskRules(0.0, 1.0, 2.0, 5.0, 0.0, True, False, False, 0),
    "avoid": TaskRules(0.1, -0.1, -5.0, -10.0, -20.0, True, False, False, 128),
    "hunt": TaskRules(0.0, 0.0, 1.0, 10.0, -20.0, False, False, True, 0),
    "ambush": TaskRules(0.0, -0.1, 0.0, 10.0, -20.0, False, False, True, 0),
    "rush": TaskRules(0.0, -0.1, 10.0, 0.0, 0.0, False, True, False, 0),
}
OBSERVATIONS = ("full", "viewport")


class MiniPacman(BatchedEnv):
    """``batch_size`` Mini PacMan games (``docs/rl.md`` §2).

    Args:
        batch_size: B, the number of instances.
        seed: seed of the instances' generators (None: fresh entropy).
        task: ``'regular'``, ``'avoid'``, ``'hunt'``, ``'ambush'`` or ``'rush'`` (rewards and
            level clearing, §2.6).
        observation: ``'full'`` (``uint8 [15, 19, 3]``, the whole board) or ``'viewport'``
            (``uint8 [5, 5, 3]`` centred on Pacman, cells off the map painted as wall).
        frame_cap: steps per episode; the episode is truncated at this many.
        pacman_double_speed: while powered (power > 0 after the step's decrement), Pacman
            makes two one-cell moves per step, eating at each cell (§2.9 option).
        collide_on_swap: a ghost also meets Pacman on the cell Pacman passed through during a
            double move (§2.9 option; without double speed it changes nothing, since Pacman
            moves first and a ghost it swaps with is already on its cell).
        pill_duration: steps a power pill lasts (20 in the reference; §2.9 recalls 19).
        level_timer: steps after which a level clears whatever happened: None for the task's
            reference timer (128 for avoid, none otherwise), 0 for none, or a number (80 is
            the recalled hunt/ambush variant of §2.9).
        power_bar: paint the remaining power as yellow cells along the bottom wall row.

    Attributes:
        stochasticity: probability that a chasing ghost picks a random branch at a junction
            (0.05); tests set it to 0 to force the branch off.
    """

    num_actions = 5

    def __init__(
        self,
        batch_size: int,
        seed: int | None = None,
        *,
        task: str = "regular",
        observation: str = "full",
        frame_cap: int = 3000,
        pacman_double_speed: bool = False,
        collide_on_swap: bool = False,
        pill_duration: int = 20,
        level_timer: int | None = None,
        power_bar: bool = False,
    ) -> None:
        owner = type(self).__name__
        self.task = check_choice("task", task, tuple(TASKS), owner=owner)
        self.observation = check_choice("observation", observation, OBSERVATIONS, owner=owner)
        self.frame_cap = check_int("frame_cap", frame_cap, owner=owner)
        self.pacman_double_speed = check_bool(
            "pacman_double_speed", pacman_double_speed, owner=owner
        )
        self.collide_on_swap = check_bool("collide_on_swap", collide_on_swap, owner=owner)
        self.pill_duration = check_int("pill_duration", pill_duration, owner=owner)
        self.rules = TASKS[task]
        timer = check_int("level_timer", level_timer, 0, owner=owner, optional=True)
        self.level_timer = self.rules.level_timer if timer is None else timer
        self.power_bar = check_bool("power_bar", power_bar, owner=owner)
        self.observation_shape = (HEIGHT, WIDTH, 3) if observation == "full" else (VIEW, VIEW, 3)
        self.stochasticity = 0.05
        super().__init__(batch_size, seed)
        B = self.batch_size
        self.pacman = np.full(B, FREE_CELLS[0])  # int [B], a cell
        self.food = np.zeros((B, NUM_CELLS), dtype=bool)
        self.food_left = np.zeros(B, dtype=np.int64)
        self.pills = np.full((B, NUM_PILLS), -1)  # int [B, 2], a cell or -1 once eaten
        self.ghost_cell = np.zeros((B, 0), dtype=np.int64)  # [B, G], G grows as needed
        self.ghost_dir = np.zeros((B, 0), dtype=np.int64)
        self.ghost_alive = np.zeros((B, 0), dtype=bool)
        self.power = np.zeros(B, dtype=np.int64)
        self.level = np.ones(B, dtype=np.int64)
        self.timer = np.zeros(B, dtype=np.int64)
        self.frame = np.zeros(B, dtype=np.int64)
        self.ended = np.ones(B, dtype=bool)  # no episode under way until reset

    # ----------------------------------------------------------------- configuration

    def _config(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "observation": self.observation,
            "frame_cap": self.frame_cap,
            "pacman_double_speed": self.pacman_double_speed,
            "collide_on_swap": self.collide_on_swap,
            "pill_duration": self.pill_duration,
            "level_timer": self.level_timer,
            "power_bar": self.power_bar,
        }

    def _grow_ghosts(self, count: int) -> None:
        """Make room for ``count`` ghosts per instance (the arrays' second axis)."""
        extra = count - self.ghost_cell.shape[1]
        if extra > 0:
            pad = ((0, 0), (0, extra))
            self.ghost_cell = np.pad(self.ghost_cell, pad)
            self.ghost_dir = np.pad(self.ghost_dir, pad)
            self.ghost_alive = np.pad(self.ghost_alive, pad)

    # ----------------------------------------------------------------- levels

    def _init_level(self, b: int, level: int) -> None:
        """Start ``level`` in instance ``b`` (§2.3); draws pills, Pacman, then each ghost's
        cell and direction from the instance's generator."""
        generator = self.generators[b]
        self.food[b] = FREE
        self.food_left[b] = FREE_CELLS.size
        self.pills[b] = FREE_CELLS[generator.integers(FREE_CELLS.size, size=NUM_PILLS)]
        pacman = FREE_CELLS[generator.integers(FREE_CELLS.size)]
        self.pacman[b] = pacman
        count = 1 + (level - 1) // 2
        self._grow_ghosts(count)
        self.ghost_alive[b] = False
        spawn = SPAWN_CELLS[pacman]
        for g in range(count):
            self.ghost_cell[b, g] = spawn[generator.integers(spawn.size)]
            self.ghost_dir[b, g] = generator.integers(4)  # [lib] a valid direction code
        self.ghost_alive[b, :count] = True
        self.power[b] = 0
        self.level[b] = level
        self.timer[b] = 0

    def _next_levels(self, instances: np.ndarray) -> None:
        for b in instances:
            self._init_level(int(b), int(self.level[b]) + 1)

    def reset(self, mask: np.ndarray | None = None) -> np.ndarray:
        for b in np.flatnonzero(self._mask(mask)):
            self.frame[b] = 0
            self._init_level(int(b), 1)
            self.ended[b] = False
        return self._observe()

    def place(
        self,
        index: int,
        *,
        pacman: tuple[int, int],
        ghosts: tuple[tuple[tuple[int, int], int], ...] = (),
        pills: tuple[tuple[int, int], ...] = (),
        food: np.ndarray | None = None,
        power: int = 0,
        level: int = 1,
        timer: int = 0,
        frame: int = 0,
    ) -> None:
        """Put instance ``index`` into a running episode in a chosen state (tests, tools).

        Args:
            pacman: Pacman's ``(row, col)``.
            ghosts: ``((row, col), direction)`` per ghost, in processing order (direction
                0 right, 1 up, 2 left, 3 down).
            pills: up to 2 pill cells ``(row, col)``.
            food: ``bool [15, 19]`` pellets (None: one on every free cell).
            power, level, timer, frame: the counters (power at most ``pill_duration``; level
                sets the ghosts' speed, ``0.5 + 0.1 (level - 1)``: from level 6 on they move
                every unpowered step).

        Raises:
            ValueError: a cell is off the map or a wall, or a value is out of range.
        """

        def cell(name: str, where: tuple[int, int]) -> int:
            row, col = (int(v) for v in where)
            if not (0 <= row < HEIGHT and 0 <= col < WIDTH and FREE[row * WIDTH + col]):
                raise ValueError(f"MiniPacman.place: {name} {where!r} is not a free cell")
            return row * WIDTH + col

        if len(pills) > NUM_PILLS:
            raise ValueError(f"MiniPacman.place: at most {NUM_PILLS} pills, got {len(pills)}")
        for name, value in (("level", level), ("power", power), ("timer", timer)):
            check_int(name, value, 1 if name == "level" else 0, owner="MiniPacman.place")
        check_int("frame", frame, 0, owner="MiniPacman.place")
        if power > self.pill_duration:
            raise ValueError(
                f"MiniPacman.place: power must be <= pill_duration = {self.pill_duration}, "
                f"got {power}"
            )
        self.pacman[index] = cell("pacman", pacman)
        self.food[index] = FREE if food is None else np.asarray(food, bool).reshape(-1) & FREE
        self.food_left[index] = self.food[index].sum()
        self.pills[index] = -1
        for j, where in enumerate(pills):
            self.pills[index, j] = cell("pill", where)
        self._grow_ghosts(len(ghosts))
        self.ghost_alive[index] = False
        for g, (where, direction) in enumerate(ghosts):
            self.ghost_cell[index, g] = cell("ghost", where)
            self.ghost_dir[index, g] = check_choice(
                "ghost direction", direction, (0, 1, 2, 3), owner="MiniPacman.place"
            )
            self.ghost_alive[index, g] = True
        self.power[index], self.level[index] = power, level
        self.timer[index], self.frame[index] = timer, frame
        self.ended[index] = False

    # ----------------------------------------------------------------- one step

    def step(self, actions: np.ndarray) -> StepResult:
        actions = self._actions(actions)
        if self.ended.any():
            raise RuntimeError(
                f"MiniPacman: instances {np.flatnonzero(self.ended).tolist()} have no episode "
                "under way (ended or never reset); call reset(mask) on them first"
            )
        rules = self.rules
        everyone = np.arange(self.batch_size)
        self.frame += 1
        self.timer += 1
        reward = np.full(self.batch_size, rules.step)
        np.maximum(self.power - 1, 0, out=self.power)
        passed = np.full(self.batch_size, -1)  # the cell a double move passed through
        double = self.power > 0 if self.pacman_double_speed else None
        relevelled = self._move_pacman(everyone, actions, reward)
        if double is not None:
            second = np.flatnonzero(double & ~relevelled)
            passed[second] = self.pacman[second]
            self._move_pacman(second, actions, reward)
            passed[passed == self.pacman] = -1
        if not self.collide_on_swap:
            passed[:] = -1
        killed = self._move_ghosts(reward, passed)
        if self.level_timer:
            self._next_levels(np.flatnonzero(self.timer == self.level_timer))
        truncated = (self.frame >= self.frame_cap) & ~killed
        self.ended = killed | truncated
        return StepResult(self._observe(), reward.astype(np.float32), killed, truncated)

    def _move_pacman(self, idx: np.ndarray, actions: np.ndarray, reward: np.ndarray) -> np.ndarray:
        """Move Pacman in instances ``idx`` one cell, eat food then at most one pill (§2.4
        steps 2-4). Returns ``bool [B]``: the instances where a new level started."""
        rules = self.rules
        relevelled = np.zeros(self.batch_size, dtype=bool)
        cells = NEXT[self.pacman[idx], actions[idx]]
        self.pacman[idx] = cells
        ate = self.food[idx, cells]
        eaters = idx[ate]
        self.food[eaters, cells[ate]] = False
        self.food_left[eaters] -= 1
        reward[eaters] += rules.food
        if rules.clear_on_food:
            cleared = eaters[self.food_left[eaters] == 0]
            self._next_levels(cleared)
            relevelled[cleared] = True
        cells = self.pacman[idx]  # a new level moved Pacman
        on_pill = self.pills[idx] == cells[:, None]  # [n, 2]
        first = on_pill.argmax(axis=1)
        hit = on_pill.any(axis=1)
        eaters = idx[hit]
        self.pills[eaters, first[hit]] = -1
        reward[eaters] += rules.pill
        self.power[eaters] = self.pill_duration
        if rules.clear_on_pills:
            cleared = eaters[(self.pills[eaters] < 0).all(axis=1)]
            self._next_levels(cleared)
            relevelled[cleared] = True
        return relevelled

    def _move_ghosts(self, reward: np.ndarray, passed: np.ndarray) -> np.ndarray:
        """Ghosts in list order (§2.4 step 5), vectorised over the instances per ghost slot.
        Returns ``bool [B]``: Pacman was killed."""
        killed = np.zeros(self.batch_size, dtype=bool)
        stopped = np.zeros(self.batch_size, dtype=bool)  # a ghost was eaten: stop this step
        for g in range(self.ghost_cell.shape[1]):
            idx = np.flatnonzero(self.ghost_alive[:, g] & ~stopped)
            if idx.size == 0:
                continue
            cells = self.ghost_cell[idx, g]
            met = (cells == self.pacman[idx]) | (cells == passed[idx])
            eaten = self._meet(idx[met], g, reward, killed, stopped)
            idx = np.setdiff1d(idx, eaten, assume_unique=True)
            powered = self.power[idx] > 0
            speed = (0.5 + 0.1 * (self.level[idx] - 1)) * np.where(powered, 0.5, 1.0)
            idx = idx[self._uniforms(idx) < speed]
            self._turn(idx, g)
            self.ghost_cell[idx, g] = NEXT[self.ghost_cell[idx, g], self.ghost_dir[idx, g] + 1]
            self._meet(idx[self.ghost_cell[idx, g] == self.pacman[idx]], g, reward, killed, stopped)
        return killed

    def _meet(
        self,
        idx: np.ndarray,
        g: int,
        reward: np.ndarray,
        killed: np.ndarray,
        stopped: np.ndarray,
    ) -> np.ndarray:
        """Ghost ``g`` meets Pacman in instances ``idx``: Pacman dies if unpowered, else the
        ghost is eaten (and the step's ghost processing stops). Returns the eating instances."""
        rules = self.rules
        powered = self.power[idx] > 0
        dead = idx[~powered]
        reward[dead] += rules.death
        killed[dead] = True
        eaten = idx[powered]
        reward[eaten] += rules.ghost
        self.ghost_alive[eaten, g] = False
        stopped[eaten] = True
        if rules.clear_on_ghosts:
            self._next_levels(eaten[~self.ghost_alive[eaten].any(axis=1)])
        return eaten

    def _uniforms(self, idx: np.ndarray) -> np.ndarray:
        """One uniform draw from each listed instance's generator, ``float [n]``."""
        generators = self.generators
        return np.array([generators[b].random() for b in idx], dtype=np.float64)

    def _turn(self, idx: np.ndarray, g: int) -> None:
        """Ghost ``g``'s new direction in instances ``idx`` (§2.5 rules 1-3)."""
        if idx.size == 0:
            return
        rows = np.arange(idx.size)
        cells = self.ghost_cell[idx, g]
        direction = self.ghost_dir[idx, g]
        available = AVAILABLE[cells]  # bool [n, 4]
        count = available.sum(axis=1)
        not_back = available.copy()
        not_back[rows, REVERSE[direction]] = False
        # 1-2. one way: take it; two ways: keep going if possible, else the way not back
        keep = available[rows, direction]
        first_not_back = np.where(count == 1, available.argmax(axis=1), not_back.argmax(axis=1))
        new = np.where((count == 2) & keep, direction, first_not_back)
        # 3. junction: score the ways (not back) by u . step, u = Pacman - ghost
        junction = count >= 3
        new[junction] = direction[junction]
        du = ROW[self.pacman[idx]] - ROW[cells]
        dv = COL[self.pacman[idx]] - COL[cells]
        junction &= (du != 0) | (dv != 0)
        scores = np.stack([dv, -du, -dv, du], axis=1)  # [n, 4]: right, up, left, down
        flee = junction & (self.power[idx] > 0)
        chase = junction & ~flee
        low = np.where(not_back, scores, np.iinfo(np.int64).max).argmin(axis=1)
        high = np.where(not_back, scores, np.iinfo(np.int64).min).argmax(axis=1)
        new[flee] = low[flee]
        new[chase] = high[chase]
        chasers = np.flatnonzero(chase)
        wander = chasers[self._uniforms(idx[chasers]) < self.stochasticity]
        for i in wander:
            choices = np.flatnonzero(not_back[i])
            new[i] = choices[self.generators[idx[i]].integers(choices.size)]
        self.ghost_dir[idx, g] = new

    # ----------------------------------------------------------------- observations

    def _paint(self, idx: np.ndarray) -> np.ndarray:
        """The boards of instances ``idx``, ``uint8 [n, 286, 3]``: 285 cells plus one wall
        pixel (what the viewport shows off the map). Each cell gets the code of what shows
        (the highest priority, painted last), then its colour from ``_PALETTE``."""
        n = idx.size
        code = np.empty((n, NUM_CELLS + 1), dtype=np.intp)
        np.multiply(self.food[idx], _FOOD, out=code[:, :NUM_CELLS])
        code[:, :NUM_CELLS] += _BOARD_CODE  # food lies on free cells only
        code[:, NUM_CELLS] = _WALL
        pills = self.pills[idx]
        where = pills >= 0
        code[np.nonzero(where)[0], pills[where]] = _PILL
        alive = self.ghost_alive[idx]
        rows = np.nonzero(alive)[0]
        ghosts = self.ghost_cell[idx][alive]
        code[rows, ghosts] = _GHOST
        power = self.power[idx]
        if self.power_bar:
            bar = np.arange(WIDTH)[None, :] < np.minimum(power, WIDTH)[:, None]  # [n, 19]
            code[np.nonzero(bar)[0], _POWER_BAR[np.nonzero(bar)[1]]] = _BAR
        code[np.arange(n), self.pacman[idx]] = _PACMAN
        image = np.take(_PALETTE, code, axis=0, mode="clip")  # [n, 286, 3]
        # a ghost is (255, e, 0), e = 255 power / pill_duration: red, yellow right after a pill
        edible = (255 * power + self.pill_duration // 2) // self.pill_duration
        shown = code[rows, ghosts] == _GHOST
        image[rows[shown], ghosts[shown], 1] = edible[rows[shown]]
        return image

    def _observe(self) -> np.ndarray:
        image = self._paint(np.arange(self.batch_size))
        if self.observation == "full":
            return image[:, :NUM_CELLS].reshape(self.batch_size, HEIGHT, WIDTH, 3)
        window = image[np.arange(self.batch_size)[:, None], VIEW_INDEX[self.pacman]]
        return window.reshape(self.batch_size, VIEW, VIEW, 3)

    def render(self, index: int = 0) -> np.ndarray:
        image = self._paint(np.array([index]))
        return image[0, :NUM_CELLS].reshape(HEIGHT, WIDTH, 3)

    def info(self) -> dict[str, np.ndarray]:
        """``level`` (the current level, from 1) and ``frame`` (steps in the episode)."""
        return {"level": self.level.copy(), "frame": self.frame.copy()}

    # ----------------------------------------------------------------- exact resume

    _ARRAYS = (
        "pacman",
        "food",
        "food_left",
        "pills",
        "ghost_cell",
        "ghost_dir",
        "ghost_alive",
        "power",
        "level",
        "timer",
        "frame",
        "ended",
    )

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {name: getattr(self, name).copy() for name in self._ARRAYS}
        state.update(
            game="MiniPacman",
            batch_size=self.batch_size,
            config=self._config(),
            generators=[g.bit_generator.state for g in self.generators],
        )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        expected = ("MiniPacman", self.batch_size, self._config())
        found = (state.get("game"), state.get("batch_size"), state.get("config"))
        if found != expected:
            raise ValueError(
                f"MiniPacman.load_state_dict: the state is from {found}, this environment is "
                f"{expected}"
            )
        for name in self._ARRAYS:
            setattr(self, name, np.array(state[name], copy=True))
        for generator, saved in zip(self.generators, state["generators"], strict=True):
            generator.bit_generator.state = saved


class MiniPacmanEnv(BatchedGymEnv):
    """Mini PacMan as a Gymnasium environment (``relmem/MiniPacman-v0``); keyword arguments
    are :class:`MiniPacman`'s (``task``, ``observation``, the §2.9 options)."""

    core_class = MiniPacman
