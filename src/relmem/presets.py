"""Named training configurations (data, not code paths).

Each preset is a function returning a fresh :class:`TrainConfig`; the CLI exposes them as
``--preset NAME`` and command-line overrides apply on top. ``PRESETS`` maps the CLI names
(``paper``, ``cpu``) of each task to the library names (``nth_farthest_paper``, ...).
"""

from __future__ import annotations

from collections.abc import Callable

from relmem.models.classifier import HeadConfig, LSTMModelConfig, RMCModelConfig
from relmem.tasks.nth_farthest import NthFarthestConfig
from relmem.train.config import OptimConfig, TrainConfig


def nth_farthest_paper() -> TrainConfig[NthFarthestConfig]:
    """The paper's set-up, ``specs/tasks.md`` 1.3 (library preset ``nth_farthest_paper``).

    K=8 vectors of F=16 dims; RMC N=8, H=8, D=K=32 (M=256), 1 block, L=2, unit gates, forget
    bias 1, input bias 0 (605,184 core parameters); head 4 x 256; Adam 1e-4, batch 1600, no
    clipping, constant learning rate (``--optim.schedule paper`` for Sonnet's decay); a 16,000
    sequence held-out set and the best accuracy on fresh 1600-sequence batches. The paper gives
    no step count; 200k steps (320M sequences) is a ceiling, not a published figure.
    """
    return TrainConfig(
        task=NthFarthestConfig(num_objects=8, num_features=16, test_size=16000),
        model="rmc",
        rmc=RMCModelConfig(
            mem_slots=8,
            head_size=32,
            num_heads=8,
            num_blocks=1,
            attention_mlp_layers=2,
            gate_style="unit",
        ),
        lstm=LSTMModelConfig(hidden_size=512),
        head=HeadConfig((256, 256, 256, 256)),
        optim=OptimConfig(lr=1e-4, schedule="constant", grad_clip=None),
        steps=200_000,
        batch_size=1600,
        eval_every=1000,
        eval_batch=1600,
        log_every=100,
        checkpoint_every=2000,
    )


def nth_farthest_cpu() -> TrainConfig[NthFarthestConfig]:
    """The default: shows learning on a 2-core CPU in about 10 minutes.

    The Sonnet example's reduced task (K=4 vectors of F=4 dims; trivial plateau 50%), a small
    RMC (N=4 slots, H=4 heads of D=16, M=64), Adam 1e-4 (the paper's rate) with gradient
    clipping at 1, batch 256, a 4,000-sequence held-out set (the paper preset's is 16,000),
    30k steps, one CPU thread (``--cpu-threads``). A 10-minute time limit stops it earlier on
    slow or shared machines (``--time-limit-min None`` lifts it).

    The learning rate matters more than anything else here: at 1e-3 the RMC, the LSTM and even
    an MLP over the flattened rows settled on the 2/K plateau and stayed there (RMC 59k steps,
    MLP 84k); at 1e-4 the RMC leaves it after about 5,000 steps. One thread: on the 2-core
    development VM, with another process busy, two threads ran 0.4 steps/s and one 31.
    """
    return TrainConfig(
        task=NthFarthestConfig(num_objects=4, num_features=4, test_size=4000),
        model="rmc",
        rmc=RMCModelConfig(mem_slots=4, head_size=16, num_heads=4),
        lstm=LSTMModelConfig(hidden_size=256),
        head=HeadConfig((256, 256, 256, 256)),
        optim=OptimConfig(lr=1e-4, grad_clip=1.0),
        steps=30_000,
        batch_size=256,
        eval_every=1000,
        eval_batch=1600,
        log_every=100,
        checkpoint_every=2000,
        time_limit_min=10.0,
        cpu_threads=1,
    )


PRESETS: dict[str, dict[str, Callable[[], TrainConfig]]] = {
    "nth-farthest": {"paper": nth_farthest_paper, "cpu": nth_farthest_cpu},
}
LIBRARY_NAMES: dict[str, Callable[[], TrainConfig]] = {
    "nth_farthest_paper": nth_farthest_paper,
    "nth_farthest_cpu": nth_farthest_cpu,
}


def get_preset(task: str, name: str) -> TrainConfig:
    """A fresh config for preset ``name`` (CLI or library name) of ``task``.

    Raises:
        KeyError: naming the known presets.
    """
    table = PRESETS.get(task, {})
    if name in table:
        return table[name]()
    if name in LIBRARY_NAMES:
        return LIBRARY_NAMES[name]()
    known = sorted(table) + sorted(LIBRARY_NAMES)
    raise KeyError(f"unknown preset {name!r} for task {task!r}; known presets: {', '.join(known)}")
