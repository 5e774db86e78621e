"""Reinforcement learning with relational memory (``docs/rl.md``): BoxWorld and Mini PacMan,
the recurrent agent, and its training on TorchRL. Needs the ``rl`` extra
(``pip install -e ".[rl]"`` in the repository).

Importing this package registers the Gymnasium ids ``relmem/BoxWorld-v0`` and
``relmem/MiniPacman-v0``::

    import gymnasium as gym
    import relmem.rl

    env = gym.make("relmem/BoxWorld-v0", grid_size=6, observation="viewport")
"""

from __future__ import annotations

from importlib.util import find_spec

if find_spec("gymnasium") is None:
    raise ImportError(
        'relmem.rl needs the rl extra (gymnasium is not installed): pip install -e ".[rl]" in '
        "the relmem repository"
    )

import gymnasium as gym  # noqa: E402  (after the check that names the extra)

_GYM_IDS = {
    "relmem/BoxWorld-v0": "relmem.rl.envs.boxworld:BoxWorldEnv",
    "relmem/MiniPacman-v0": "relmem.rl.envs.minipacman:MiniPacmanEnv",
}

for _id, _entry_point in _GYM_IDS.items():
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=_entry_point)

__all__ = ["ConvLSTMModule", "RMCModule"]


def __getattr__(name: str) -> object:
    """``RMCModule`` and ``ConvLSTMModule`` (:mod:`relmem.rl.modules`), imported on first use
    so that registering the Gymnasium ids does not import TorchRL."""
    if name in __all__:
        missing = [m for m in ("torchrl", "tensordict") if find_spec(m) is None]
        if missing:
            raise ImportError(
                f"relmem.rl.{name} needs the rl extra ({', '.join(missing)} not installed): "
                'pip install -e ".[rl]" in the relmem repository'
            )
        from relmem.rl import modules

        return getattr(modules, name)
    raise AttributeError(f"module 'relmem.rl' has no attribute {name!r}")
