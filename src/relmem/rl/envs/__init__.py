"""The RL environments: each game is one batched numpy implementation
(:class:`~relmem.rl.envs.base.BatchedEnv`) with a Gymnasium and a TorchRL face."""
