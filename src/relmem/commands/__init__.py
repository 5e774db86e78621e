"""Thin ``relmem`` sub-commands: parse arguments, call the library, set the exit status.

With the ``rl`` extra installed (TorchRL and Gymnasium), importing this package registers the
reinforcement-learning tasks (``boxworld``, ``minipacman``: :mod:`relmem.rl.tasks`), so that
``relmem train``, ``eval``, ``plot`` and ``play`` know them (without it, naming one says which
packages are missing); the core library never imports them.
"""

from importlib.util import find_spec

from relmem.tasks.registry import mark_unavailable

RL_PACKAGES = ("torchrl", "tensordict", "gymnasium")  # the rl extra

_missing = [name for name in RL_PACKAGES if find_spec(name) is None]
if not _missing:
    import relmem.rl.tasks  # noqa: F401  (registers the RL tasks)
else:
    for _task in ("boxworld", "minipacman"):
        mark_unavailable(
            _task,
            f"needs the rl extra ({', '.join(_missing)} not installed): "
            'pip install -e ".[rl]" in the relmem repository',
        )
