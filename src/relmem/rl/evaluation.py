"""Play a fixed set of held-out episodes with a policy, or a uniform random policy.

Episode ``i`` of an evaluation with seed ``s`` is played on its own instance, whose generator is
the ``i``-th child of ``numpy.random.SeedSequence([HELD_OUT_TAG, s])``: its level depends on
``(s, i)`` alone, not on the batch size, the policy or the other episodes, so a trained agent
and the random policy meet exactly the same levels. Training environments are seeded with a
plain integer (``SeedSequence(seed)``), whose streams differ from these.

Episodes are batched as a pool: ``batch_size`` instances are stepped together, and an instance
whose episode ends starts the next episode not yet begun, on that episode's own generator. A
long episode then holds up only the last few, where batches played one after the other would
each wait for their own longest episode (a Mini PacMan agent that survives to the 3,000-step
cap made 1,000-episode evaluations run for minutes). Once every episode has begun, an instance
that ends is restarted on a level that is not counted (the batched core may not be stepped
after an end) until the last counted episode ends.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from tensordict.nn import TensorDictModuleBase
from torchrl.envs import ExplorationType, InitTracker, TransformedEnv, set_exploration_type
from torchrl.envs.utils import step_mdp
from torchrl.modules.utils import get_primers_from_module

from relmem.rl import keys
from relmem.rl.envs.base import BatchedEnv
from relmem.rl.envs.torchrl_env import TorchRLBatchedEnv, game_class
from relmem.validation import check_bool, check_int

__all__ = ["HELD_OUT_TAG", "Evaluation", "evaluate", "held_out_level"]

#: Mixed into every held-out seed, so held-out levels never share a stream with training's.
HELD_OUT_TAG = 0x4E1D_0D7


@dataclass(frozen=True)
class Evaluation:
    """The figures of an evaluation.

    Attributes:
        episodes: how many episodes were played.
        mean_return, return_stderr: the mean undiscounted return and its standard error
            (sample standard deviation / sqrt(episodes); NaN for one episode).
        mean_length: the mean episode length in steps.
        solve_rate, solve_stderr: the fraction of episodes whose core reports ``solved`` at the
            end (BoxWorld: the gem collected) and its standard error; None for games without
            that counter.
    """

    episodes: int
    mean_return: float
    return_stderr: float
    mean_length: float
    solve_rate: float | None
    solve_stderr: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def held_out_level(seed: int, index: int) -> np.random.Generator:
    """The generator of held-out episode ``index`` of ``seed``: child ``index`` of
    ``SeedSequence([HELD_OUT_TAG, seed])``, made directly (as ``spawn`` makes its children), so
    that episode 10⁶ costs what episode 0 does."""
    child = np.random.SeedSequence([HELD_OUT_TAG, seed], spawn_key=(index,))
    return np.random.Generator(np.random.PCG64(child))


def policy_device(policy: torch.nn.Module) -> torch.device:
    """Where ``policy``'s parameters live (the CPU for one without any). The games step on the
    CPU: a policy elsewhere gets each step's entries moved to it and its output moved back."""
    return next((p.device for p in policy.parameters()), torch.device("cpu"))


def _play(
    core: BatchedEnv,
    policy: TensorDictModuleBase | None,
    seed: int,
    episodes: int,
    generator: torch.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Play held-out episodes ``0 .. episodes - 1`` of ``seed`` (episode ``i`` on
    :func:`held_out_level`) on the instances of ``core`` as a pool: ``(returns [E], lengths
    [E], solved [E] | None)``."""
    env = TransformedEnv(TorchRLBatchedEnv(core), InitTracker(init_key=keys.IS_INIT))
    if policy is not None:
        primers = get_primers_from_module(policy, warn=False)
        if primers is not None:
            env.append_transform(primers)
    B, E = core.batch_size, episodes
    returns, lengths = np.zeros(E), np.zeros(E, dtype=np.int64)
    solved = np.zeros(E, dtype=bool) if "solved" in core.info() else None
    finished = np.zeros(E, dtype=bool)
    episode = np.arange(B)  # the episode each instance plays; -1: an uncounted one
    begun = B
    core.generators = [held_out_level(seed, i) for i in range(B)]
    device = None if policy is None else policy_device(policy)
    td = env.reset()
    while not finished.all():
        if policy is None:
            td.set(keys.ACTION, torch.randint(core.num_actions, (B,), generator=generator))
        else:
            td = policy(td.to(device)).to(env.device)
        td = env.step(td)
        counted = episode >= 0
        played = episode[counted]
        returns[played] += td["next", keys.REWARD][:, 0].numpy()[counted]
        lengths[played] += 1
        ended = counted & td["next", keys.DONE][:, 0].numpy()
        if solved is not None:
            solved[episode[ended]] = td["next", "info", "solved"].numpy()[ended]
        finished[episode[ended]] = True
        for b in np.flatnonzero(ended):  # restarted by the reset below, on the next level
            if begun < E:
                episode[b], core.generators[b] = begun, held_out_level(seed, begun)
                begun += 1
            else:
                episode[b] = -1
        td = env.maybe_reset(step_mdp(td, keep_other=True))
    return returns, lengths, solved


def evaluate(
    game: str | type[BatchedEnv],
    policy: TensorDictModuleBase | None = None,
    *,
    episodes: int = 1000,
    seed: int = 0,
    batch_size: int = 64,
    greedy: bool = False,
    **options: Any,
) -> Evaluation:
    """Play ``episodes`` held-out episodes of ``game`` with ``policy``.

    Args:
        game: ``'boxworld'``, ``'minipacman'`` or a :class:`BatchedEnv` subclass.
        policy: a TorchRL policy reading the environment's entries and writing ``action``
            (``Agent.policy``; its primers are found in it and appended), or None for the
            uniform random policy.
        episodes: how many episodes (default 1000).
        seed: picks the held-out set (:func:`held_out_level`).
        batch_size: instances stepped together (the pool's size). The default, 64, is
            about the fastest for both games on a 2-core CPU: a larger pool steps faster per
            episode-step but plays the longest episode's tail at its full width (1000 Mini
            PacMan episodes, the longest at the 3,000-step cap: 22 s at 64, 42 s at 250).
        greedy: take the policy's most probable action instead of sampling it.
        **options: the game's parameters (``grid_size``, ``observation``, ...).

    Returns:
        :class:`Evaluation`.
    """
    episodes = int(check_int("episodes", episodes, owner="evaluate"))
    batch_size = int(check_int("batch_size", batch_size, owner="evaluate"))
    seed = int(check_int("seed", seed, minimum=0, owner="evaluate"))
    check_bool("greedy", greedy, owner="evaluate")
    cls = game_class(game) if isinstance(game, str) else game
    random_actions = torch.Generator().manual_seed(seed)
    exploration = ExplorationType.DETERMINISTIC if greedy else ExplorationType.RANDOM
    with torch.no_grad(), set_exploration_type(exploration):
        core = cls(batch_size=min(batch_size, episodes), seed=seed, **options)
        returns, lengths, solved = _play(core, policy, seed, episodes, random_actions)
    # one episode has no spread to measure: NaN, not a standard error of 0
    stderr = float(returns.std(ddof=1) / math.sqrt(episodes)) if episodes > 1 else math.nan
    solve_rate = solve_stderr = None
    if solved is not None:
        solve_rate = float(solved.mean())
        solve_stderr = math.sqrt(solve_rate * (1 - solve_rate) / episodes)
    return Evaluation(
        episodes,
        float(returns.mean()),
        stderr,
        float(lengths.mean()),
        solve_rate,
        solve_stderr,
    )
