"""The TensorDict keys shared by the environments, the agent and the learners.

The environment writes ``OBSERVATION``, ``REWARD``, ``DONE``, ``TERMINATED``, ``TRUNCATED`` and,
through TorchRL's ``InitTracker``, ``IS_INIT``; the agent reads the observation, ``IS_INIT`` and
its recurrent state and writes ``LOGITS``, ``ACTION``, ``ACTION_LOG_PROB`` and
``STATE_VALUE`` (and its next state under ``("next", key)``).
"""

from __future__ import annotations

OBSERVATION = "observation"  # uint8 [*B, H, W, C]
ACTION = "action"  # int64 [*B], an index in 0..num_actions-1
REWARD = "reward"  # float32 [*B, 1]
DONE = "done"  # bool [*B, 1]: terminated or truncated
TERMINATED = "terminated"  # bool [*B, 1]
TRUNCATED = "truncated"  # bool [*B, 1]
IS_INIT = "is_init"  # bool [*B, 1]: the first step of an episode (TorchRL's InitTracker)
LOGITS = "logits"  # float32 [*B, num_actions]
ACTION_LOG_PROB = "action_log_prob"  # float32 [*B], TorchRL ProbabilisticActor's default key
STATE_VALUE = "state_value"  # float32 [*B, 1]
