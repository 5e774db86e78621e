"""Thin ``relmem`` sub-commands: parse arguments, call the library, set the exit status.

With the ``rl`` extra installed (TorchRL and Gymnasium), importing this package registers the
reinforcement-learning tasks (``boxworld``, ``minipacman``: :mod:`relmem.rl.tasks`), so that
``relmem train``, ``eval``, ``plot`` and ``play`` know them; the core library never imports
them.
"""

from importlib.util import find_spec

if find_spec("torchrl") is not None and find_spec("gymnasium") is not None:
    import relmem.rl.tasks  # noqa: F401  (registers the RL tasks)
