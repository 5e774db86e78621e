"""Mini PacMan (``docs/rl.md`` §2): the acceptance checks of §2.10 and the batched contract."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import relmem.rl  # noqa: F401  (registers the gymnasium ids)
from relmem.rl.envs.minipacman import MAZE, TASKS, MiniPacman, MiniPacmanEnv

NOOP, RIGHT, UP, LEFT, DOWN = range(5)
R, U, L, D = range(4)  # ghost directions


def cell(row: int, col: int) -> int:
    return row * len(MAZE[0]) + col


def one_step(env: MiniPacman, action: int):
    return env.step(np.array([action]))


# ---------------------------------------------------------------- §2.10.1 the maze


def test_maze_has_138_free_cells_and_24_junctions() -> None:
    free = np.array([[c == "." for c in row] for row in MAZE])
    assert free.shape == (15, 19) and free.sum() == 138
    padded = np.pad(free, 1)
    ways = sum(np.roll(padded, shift, axis)[1:-1, 1:-1] for shift in (1, -1) for axis in (0, 1))[
        free
    ]
    assert (ways == 3).sum() == 16 and (ways == 4).sum() == 8
    assert ways.min() == 2  # no dead ends


# ---------------------------------------------------------------- §2.10.2 ghost movement


def ghost_after_one_step(pacman, ghost, direction, power=0, stochasticity=0.0):
    """Where a ghost is and faces after one no-op step; level 16 makes it move surely."""
    env = MiniPacman(1, seed=0)
    env.stochasticity = stochasticity
    env.place(0, pacman=pacman, ghosts=((ghost, direction),), power=power, level=16)
    one_step(env, NOOP)
    assert not env.ended[0]
    return divmod(int(env.ghost_cell[0, 0]), 19), int(env.ghost_dir[0, 0])


@pytest.mark.parametrize(
    ("pacman", "direction", "expected"),
    [((3, 12), R, ((3, 9), R)), ((3, 12), L, ((3, 7), L)), ((13, 1), R, ((3, 9), R))],
)
def test_ghost_in_a_corridor_keeps_going(pacman, direction, expected) -> None:
    assert ghost_after_one_step(pacman, (3, 8), direction) == expected


@pytest.mark.parametrize(
    ("direction", "expected"),
    [(U, ((1, 2), R)), (L, ((2, 1), D)), (R, ((1, 2), R)), (D, ((2, 1), D))],
)
def test_ghost_at_a_corner_turns_away_from_where_it_came(direction, expected) -> None:
    # (1, 1) opens right and down; arriving upward it turns right, arriving leftward down
    assert ghost_after_one_step((13, 17), (1, 1), direction) == expected


@pytest.mark.parametrize(
    ("pacman", "ghost", "direction", "expected"),
    [
        ((11, 5), (3, 5), R, ((4, 5), D)),  # Pacman below: down
        ((11, 5), (3, 5), U, ((3, 6), R)),  # down is the reverse; right/left tie: right
        ((1, 1), (3, 5), D, ((3, 4), L)),  # u = (-2, -4): left
        ((1, 7), (3, 5), R, ((3, 6), R)),  # u = (-2, 2): right and up tie: right
        ((1, 7), (3, 5), L, ((2, 5), U)),  # right is the reverse: up
        ((1, 5), (3, 5), D, ((3, 6), R)),  # up is best but the reverse: never taken
        ((11, 17), (3, 1), U, ((3, 2), R)),  # three-way junction: right over up
    ],
)
def test_ghost_at_a_junction_chases_with_the_largest_product(
    pacman, ghost, direction, expected
) -> None:
    assert ghost_after_one_step(pacman, ghost, direction) == expected


@pytest.mark.parametrize(
    ("pacman", "ghost", "direction", "expected"),
    [
        ((11, 5), (3, 5), R, ((2, 5), U)),  # flee up, never left (the reverse)
        ((3, 1), (3, 5), L, ((2, 5), U)),  # up/down tie at 0: up
        ((11, 17), (3, 1), U, ((2, 1), U)),  # three-way: up over right
    ],
)
def test_powered_ghost_at_a_junction_flees_with_the_smallest_product(
    pacman, ghost, direction, expected
) -> None:
    assert ghost_after_one_step(pacman, ghost, direction, power=5) == expected


def test_random_branch_picks_any_way_but_back() -> None:
    env = MiniPacman(200, seed=3)
    env.stochasticity = 1.0
    for b in range(200):
        env.place(b, pacman=(11, 5), ghosts=(((3, 5), R),), level=16)
    env.step(np.zeros(200, dtype=np.int64))
    seen = set(env.ghost_cell[:, 0].tolist())
    assert seen == {cell(3, 6), cell(2, 5), cell(4, 5)}  # right, up, down; never left


def trace(seed: int, steps: int = 300) -> list[np.ndarray]:
    env = MiniPacman(8, seed=seed, task="hunt")
    actions = np.random.default_rng(0).integers(5, size=(steps, 8))
    out = [env.reset()]
    for a in actions:
        if env.ended.any():
            out.append(env.reset(env.ended.copy()))
        result = env.step(a)
        out += [result.observation, result.reward, result.terminated, result.truncated]
    return out


def test_same_seed_same_trace() -> None:
    first, second, other = trace(5), trace(5), trace(6)
    assert all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


# ---------------------------------------------------------------- §2.10.3 pills and ghosts


@pytest.mark.parametrize("pill_duration", [20, 19])
def test_a_pill_makes_ghosts_edible_for_exactly_pill_duration_steps(pill_duration) -> None:
    """Pacman eats a pill at step 0, then walks onto a ghost at step j: eaten for
    j < pill_duration, killed at j = pill_duration."""
    rules = TASKS["hunt"]
    for j in range(pill_duration + 1):
        env = MiniPacman(1, seed=0, task="hunt", pill_duration=pill_duration)
        far = ((13, 1), R)  # a second ghost, so the level does not clear
        ghost = (((3, 8), R),) if j == 0 else (((13, 17), L),)
        env.place(0, pacman=(3, 7), pills=((3, 8),), food=np.zeros((15, 19)), ghosts=ghost + (far,))
        result = one_step(env, RIGHT)
        for _ in range(j - 1):
            result = one_step(env, NOOP)
        if j > 0:
            env.ghost_cell[0, 0] = cell(3, 9)
            env.ghost_alive[0, 0] = True
            result = one_step(env, RIGHT)
        pill = rules.pill if j == 0 else 0.0
        if j < pill_duration:
            assert result.reward[0] == pytest.approx(pill + rules.ghost), j
            assert not env.ghost_alive[0, 0] and env.ghost_alive[0, 1]
            assert not result.terminated[0]
        else:
            assert result.reward[0] == pytest.approx(rules.death), j
            assert result.terminated[0] and not result.truncated[0]


@pytest.mark.parametrize("task", list(TASKS))
def test_eating_an_edible_ghost_gives_the_task_reward_and_removes_it(task) -> None:
    env = MiniPacman(1, seed=0, task=task)
    ghosts = (((3, 9), U), ((13, 1), R))
    env.place(0, pacman=(3, 8), ghosts=ghosts, food=np.zeros((15, 19)), power=10)
    result = one_step(env, RIGHT)
    assert result.reward[0] == pytest.approx(TASKS[task].step + TASKS[task].ghost)
    assert env.ghost_alive[0].tolist() == [False, True] and not result.terminated[0]


@pytest.mark.parametrize("task", list(TASKS))
def test_touching_a_non_edible_ghost_ends_the_episode(task) -> None:
    env = MiniPacman(1, seed=0, task=task)
    env.place(0, pacman=(3, 8), ghosts=(((3, 9), R),), food=np.zeros((15, 19)))
    result = one_step(env, RIGHT)
    assert result.terminated[0] and not result.truncated[0]
    # the ghost that killed moves on; a second meeting would add the death reward again
    assert result.reward[0] in (
        pytest.approx(TASKS[task].step + TASKS[task].death),
        pytest.approx(TASKS[task].step + 2 * TASKS[task].death),
    )
    with pytest.raises(RuntimeError, match="reset"):
        one_step(env, NOOP)


def test_eating_the_last_ghost_clears_a_hunt_level() -> None:
    env = MiniPacman(1, seed=0, task="hunt")
    env.place(0, pacman=(3, 8), ghosts=(((3, 9), U),), power=10, level=3)
    result = one_step(env, RIGHT)
    assert result.reward[0] == 10.0 and env.info()["level"][0] == 4
    assert env.ghost_alive[0].sum() == 2 and env.power[0] == 0


def test_food_and_level_clearing_in_regular() -> None:
    env = MiniPacman(1, seed=0)
    food = np.zeros((15, 19), dtype=bool)
    food[3, 9] = food[3, 10] = True
    env.place(0, pacman=(3, 8), food=food, ghosts=(((13, 1), R),))
    assert one_step(env, RIGHT).reward[0] == 1.0 and env.info()["level"][0] == 1
    assert one_step(env, RIGHT).reward[0] == 1.0 and env.info()["level"][0] == 2
    assert env.food[0].sum() == 138 and env.ghost_alive[0].sum() == 1


def test_food_under_the_start_cell_is_eaten_on_a_no_op() -> None:
    env = MiniPacman(1, seed=0)
    env.place(0, pacman=(3, 8), ghosts=(((13, 1), R),))
    assert one_step(env, NOOP).reward[0] == 1.0


def test_rush_clears_when_both_pills_are_eaten() -> None:
    env = MiniPacman(1, seed=0, task="rush")
    env.place(0, pacman=(3, 7), pills=((3, 8), (3, 8)), ghosts=(((13, 1), R),))
    first = one_step(env, RIGHT).reward[0]
    second = one_step(env, NOOP).reward[0]  # at most one pill per step
    assert (first, second) == (pytest.approx(9.9), pytest.approx(10.0))
    assert env.info()["level"][0] == 2


@pytest.mark.parametrize(
    ("task", "timer", "clears_after"), [("avoid", None, 128), ("hunt", 80, 80)]
)
def test_level_timer(task, timer, clears_after) -> None:
    env = MiniPacman(1, seed=0, task=task, level_timer=timer)
    env.place(0, pacman=(3, 8), ghosts=(((13, 1), R), ((13, 17), L)), timer=clears_after - 2)
    env.stochasticity = 0.0
    one_step(env, NOOP)
    assert env.info()["level"][0] == 1
    one_step(env, NOOP)
    assert env.info()["level"][0] == 2 and env.timer[0] == 0


def test_frame_cap_truncates() -> None:
    env = MiniPacman(2, seed=0, frame_cap=5)
    env.place(0, pacman=(3, 8), ghosts=(((13, 1), R),), frame=3)
    env.place(1, pacman=(3, 8), ghosts=(((13, 1), R),))
    result = env.step(np.zeros(2, dtype=np.int64))
    assert not result.truncated.any()
    result = env.step(np.zeros(2, dtype=np.int64))
    assert result.truncated.tolist() == [True, False] and not result.terminated.any()
    assert env.info()["frame"].tolist() == [5, 2]
    with pytest.raises(RuntimeError, match=r"\[0\]"):
        env.step(np.zeros(2, dtype=np.int64))
    env.reset(np.array([True, False]))
    assert env.info()["frame"].tolist() == [0, 2]
    env.step(np.zeros(2, dtype=np.int64))


def test_stepping_before_reset_raises() -> None:
    with pytest.raises(RuntimeError, match="reset"):
        MiniPacman(2, seed=0).step(np.zeros(2, dtype=np.int64))


# ---------------------------------------------------------------- §2.9 options


def test_double_speed_moves_two_cells_while_powered_and_eats_both() -> None:
    env = MiniPacman(1, seed=0, pacman_double_speed=True)
    env.place(0, pacman=(3, 6), ghosts=(((13, 1), R),), power=3)
    assert one_step(env, RIGHT).reward[0] == 2.0 and env.pacman[0] == cell(3, 8)
    env.place(0, pacman=(3, 16), ghosts=(((13, 1), R),), power=3)  # the wall stops the 2nd
    one_step(env, RIGHT)
    assert env.pacman[0] == cell(3, 17)
    env.place(0, pacman=(3, 6), ghosts=(((13, 1), R),))
    one_step(env, RIGHT)
    assert env.pacman[0] == cell(3, 7)


@pytest.mark.parametrize("swap", [False, True])
def test_collide_on_swap_meets_a_ghost_passed_through(swap) -> None:
    env = MiniPacman(1, seed=0, pacman_double_speed=True, collide_on_swap=swap, task="hunt")
    env.place(0, pacman=(3, 6), ghosts=(((3, 7), L), ((13, 1), R)), power=3)
    result = one_step(env, RIGHT)
    assert (result.reward[0] == 10.0) == swap


def test_power_bar_and_ghost_colour() -> None:
    env = MiniPacman(1, seed=0, power_bar=True)
    env.place(0, pacman=(3, 6), ghosts=(((13, 1), R),), pills=((3, 7),))
    frame = one_step(env, RIGHT).observation[0]
    assert (frame[14, :19] == (255, 255, 0)).all()  # power 20 fills the 19 cells
    ghost = divmod(int(env.ghost_cell[0, 0]), 19)
    assert frame[ghost].tolist() == [255, 255, 0]
    frame = one_step(env, NOOP).observation[0]
    assert (frame[14, :19] == (255, 255, 0)).all() and frame[14, 0].tolist() == [255, 255, 0]
    frame = one_step(env, NOOP).observation[0]  # power 18
    assert (frame[14, :18] == (255, 255, 0)).all() and frame[14, 18].tolist() == [255] * 3
    ghost = divmod(int(env.ghost_cell[0, 0]), 19)
    assert frame[ghost].tolist() == [255, round(255 * 18 / 20), 0]


# ---------------------------------------------------------------- observations


def test_full_observation_colours() -> None:
    env = MiniPacman(1, seed=0)
    food = np.zeros((15, 19), dtype=bool)
    food[5, 5] = True
    env.place(0, pacman=(3, 8), ghosts=(((13, 1), R),), pills=((1, 1),), food=food)
    env.stochasticity = 0.0
    frame = one_step(env, NOOP).observation[0]
    assert frame.dtype == np.uint8 and frame.shape == (15, 19, 3)
    assert frame[3, 8].tolist() == [0, 255, 0]
    assert frame[1, 1].tolist() == [0, 255, 255]
    assert frame[5, 5].tolist() == [0, 0, 255]
    assert frame[0, 0].tolist() == [255, 255, 255] and frame[3, 9].tolist() == [0, 0, 0]
    ghost = divmod(int(env.ghost_cell[0, 0]), 19)
    assert frame[ghost].tolist() == [255, 0, 0]
    np.testing.assert_array_equal(frame, env.render(0))


def test_viewport_is_an_egocentric_crop_padded_with_wall() -> None:
    env = MiniPacman(3, seed=1, observation="viewport")
    observation = env.reset()
    assert observation.shape == (3, 5, 5, 3) and observation.dtype == np.uint8
    for b in range(3):
        padded = np.pad(env.render(b), ((2, 2), (2, 2), (0, 0)), constant_values=255)
        row, col = divmod(int(env.pacman[b]), 19)
        np.testing.assert_array_equal(observation[b], padded[row : row + 5, col : col + 5])
    env.place(0, pacman=(1, 1), ghosts=(((13, 17), R),))
    view = one_step_batch(env)[0]
    assert view[2, 2].tolist() == [0, 255, 0] and (view[:2] == 255).all()


def one_step_batch(env: MiniPacman) -> np.ndarray:
    return env.step(np.zeros(env.batch_size, dtype=np.int64)).observation


# ---------------------------------------------------------------- §2.10.4 random policy

# [PE] under a uniform random policy, 300 episodes per task (docs/rl.md §2.6): mean return,
# and its standard deviation where published (else this run's is used for both samples).
RANDOM_POLICY = {"regular": (9.1, 8.2), "avoid": (-16.9, None), "hunt": (-19.9, None),
                 "ambush": (-21.0, None), "rush": (0.5, None)}  # fmt: skip


def random_returns(task: str, episodes: int, seed: int, slots: int = 40) -> np.ndarray:
    """``episodes`` returns under a uniform random policy: each of ``slots`` instances plays
    ``episodes / slots`` whole episodes in a row (all of them kept, so long ones are not cut)."""
    env = MiniPacman(slots, seed=seed, task=task)
    env.reset()
    rng = np.random.default_rng(seed)
    per_slot = episodes // slots
    returns = np.zeros((slots, per_slot))
    done = np.zeros(slots, dtype=np.int64)  # episodes finished per slot
    everyone = np.arange(slots)
    while (done < per_slot).any():
        if env.ended.any():
            env.reset(env.ended.copy())
        result = env.step(rng.integers(5, size=slots))
        playing = everyone[done < per_slot]
        returns[playing, done[playing]] += result.reward[playing]
        done[playing] += (result.terminated | result.truncated)[playing]
    return returns.reshape(-1)


@pytest.mark.parametrize(
    "episodes", [400, pytest.param(4000, marks=pytest.mark.slow)], ids=["quick", "long"]
)
@pytest.mark.parametrize("task", list(RANDOM_POLICY))
def test_random_policy_matches_the_reference(task, episodes) -> None:
    returns = random_returns(task, episodes, seed=11)
    reference, reference_sd = RANDOM_POLICY[task]
    sd = returns.std(ddof=1)
    error = np.sqrt(sd**2 / episodes + (reference_sd or sd) ** 2 / 300)
    assert abs(returns.mean() - reference) < 3 * error, (returns.mean(), error)


# ---------------------------------------------------------------- gymnasium, resume, errors


@pytest.mark.parametrize("observation", ["full", "viewport"])
def test_gymnasium_env_checker(observation) -> None:
    made = gym.make("relmem/MiniPacman-v0", observation=observation, render_mode="rgb_array")
    assert isinstance(made.unwrapped, MiniPacmanEnv)
    check_env(made.unwrapped, skip_render_check=False)
    env = gym.make("relmem/MiniPacman-v0", task="avoid", observation=observation)
    observation_, info = env.reset(seed=3)
    assert observation_.shape == env.observation_space.shape
    assert info == {"level": 1, "frame": 0}
    assert env.step(0)[4]["frame"] == 1


def test_state_dict_round_trip_continues_identically() -> None:
    env = MiniPacman(6, seed=2, task="hunt", observation="viewport")
    rng = np.random.default_rng(1)
    env.reset()

    def play(game: MiniPacman, actions: np.ndarray) -> list[np.ndarray]:
        out = []
        for a in actions:
            if game.ended.any():
                out.append(game.reset(game.ended.copy()))
            result = game.step(a)
            out += [result.observation, result.reward, result.terminated, game.info()["level"]]
        return out

    play(env, rng.integers(5, size=(60, 6)))
    state = env.state_dict()
    later = rng.integers(5, size=(200, 6))
    expected = play(env, later)
    other = MiniPacman(6, seed=99, task="hunt", observation="viewport")
    other.load_state_dict(state)
    assert all(np.array_equal(a, b) for a, b in zip(play(other, later), expected, strict=True))
    with pytest.raises(ValueError, match="load_state_dict"):
        MiniPacman(6, seed=2, task="avoid", observation="viewport").load_state_dict(state)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"task": "maze"}, ValueError, "task must be one of 'regular', 'avoid'"),
        ({"observation": "pixels"}, ValueError, "observation must be one of 'full', 'viewport'"),
        ({"frame_cap": 0}, ValueError, "frame_cap must be an integer >= 1"),
        ({"pill_duration": 2.5}, ValueError, "pill_duration must be an integer >= 1"),
        ({"level_timer": -1}, ValueError, "level_timer must be None or an integer >= 0"),
        ({"power_bar": "yes"}, TypeError, "power_bar must be True or False"),
        ({"pacman_double_speed": 1}, TypeError, "pacman_double_speed must be True or False"),
        ({"collide_on_swap": None}, TypeError, "collide_on_swap must be True or False"),
    ],
)
def test_bad_arguments_are_named(options, error, message) -> None:
    with pytest.raises(error, match=f"MiniPacman: {message}"):
        MiniPacman(2, **options)
    with pytest.raises(error, match=message):
        gym.make("relmem/MiniPacman-v0", **options)


def test_bad_actions_and_placements() -> None:
    env = MiniPacman(2, seed=0)
    env.reset()
    with pytest.raises(ValueError, match="actions must lie in 0..4"):
        env.step(np.array([0, 5]))
    with pytest.raises(ValueError, match="not a free cell"):
        env.place(0, pacman=(0, 0))
