"""Benchmarking code behind ``relmem bench`` and ``benchmarks/``.

- :mod:`~relmem.benchmarking.configs`: the benchmark configurations and implementation names;
- :mod:`~relmem.benchmarking.baselines`: what the RMC is timed against (``nn.LSTM``, the
  matmul floor);
- :mod:`~relmem.benchmarking.timing`: the timing harness (round-robin repeats, saved bytes);
- :mod:`~relmem.benchmarking.runner`: one configuration's implementations timed into records;
- :mod:`~relmem.benchmarking.report`: the summary table, the JSON files, reading them back.
- :mod:`~relmem.benchmarking.precision`: a run's outputs and gradients against a float64 run's
  (``benchmarks/rmc_precision.py``, the fast path's bf16 tests).
"""
