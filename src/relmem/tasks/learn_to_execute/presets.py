"""Presets of ``relmem train lte``: the paper's set-up and a CPU-sized one per task.

- ``paper`` (``docs/tasks.md`` §2.5): full programs at L=5, N=2, the Mix curriculum, batch
  128, Adam 1e-3 (TensorFlow's epsilon placement, ``--optim.eps-hat``), 200K steps; the RMC
  of the paper's sweep that "worked well" (4 slots, 4 heads of 128, 'memory' gating, one
  block, a 2-layer attention MLP); the LSTM baseline with 2 layers of 1024 units (without
  the paper's skip connections and concatenated layer outputs); the DNC with 80 slots of 64,
  4 read heads, 1 write head and a 2-layer LSTM controller of 256 units. The head is 4 x
  Linear(256) + ReLU per decoder step.
- ``cpu`` (full programs) and ``cpu-{task}`` for every other task type, for 10 minutes on one
  CPU thread: program tasks at literal length L=3 and nesting N=2 (the paper's L=5 learns too
  slowly for that budget), memorisation at L=5, N=1; the Mix curriculum; small cores (an RMC
  of 2 slots and 2 heads of 32 with 'memory' gating, an LSTM of 128 units, a DNC of 16 slots
  of 16), a head of 2 x Linear(128) + ReLU, batch 64, Adam 2e-3; the held-out set is the full
  12,800 programs at (L, N).
"""

from __future__ import annotations

from relmem.models import DNCModelConfig, HeadConfig, LSTMModelConfig, RMCModelConfig
from relmem.tasks.learn_to_execute.programs import MEMORISATION, TASK_NAMES
from relmem.tasks.learn_to_execute.task import LearnToExecuteConfig
from relmem.tasks.registry import register_preset
from relmem.train.config import OptimConfig, TrainConfig


@register_preset("lte", "paper")
def lte_paper() -> TrainConfig[LearnToExecuteConfig]:
    """The paper's Learning to Execute protocol on full programs (A.2; ``docs/tasks.md``
    §2.5); ``--task`` picks another task."""
    return TrainConfig(
        task=LearnToExecuteConfig(task_type="program", max_length=5, max_nesting=2),
        model="rmc",
        rmc=RMCModelConfig(
            mem_slots=4,
            head_size=128,
            num_heads=4,
            num_blocks=1,
            attention_mlp_layers=2,
            gate_style="memory",
        ),
        lstm=LSTMModelConfig(hidden_size=1024, num_layers=2),
        dnc=DNCModelConfig(
            hidden_size=256,
            num_layers=2,
            memory_size=80,
            word_size=64,
            num_read_heads=4,
            num_write_heads=1,
        ),
        head=HeadConfig((256, 256, 256, 256)),
        optim=OptimConfig(lr=1e-3, eps_hat=True),  # Sonnet's tf.train.AdamOptimizer
        steps=200_000,
        batch_size=128,
        eval_every=2000,
        eval_batch=1280,
        log_every=200,
        checkpoint_every=10_000,
    )


def _cpu(task_type: str) -> TrainConfig[LearnToExecuteConfig]:
    """The CPU-sized run of ``task_type`` (see the module docstring)."""
    memorisation = task_type in MEMORISATION
    return TrainConfig(
        task=LearnToExecuteConfig(
            task_type=task_type,
            max_length=5 if memorisation else 3,
            max_nesting=1 if memorisation else 2,
        ),
        model="rmc",
        rmc=RMCModelConfig(
            mem_slots=2, head_size=32, num_heads=2, attention_mlp_layers=2, gate_style="memory"
        ),
        lstm=LSTMModelConfig(hidden_size=128),
        dnc=DNCModelConfig(
            hidden_size=64, memory_size=16, word_size=16, num_read_heads=2, num_write_heads=1
        ),
        head=HeadConfig((128, 128)),
        optim=OptimConfig(lr=2e-3),
        steps=100_000,
        batch_size=64,
        time_limit_min=10.0,
        eval_every=500,
        eval_batch=1280,
        log_every=100,
        checkpoint_every=1000,
        cpu_threads=1,
        tensorboard=False,
    )


@register_preset("lte", "cpu", default=True)
def lte_cpu() -> TrainConfig[LearnToExecuteConfig]:
    """Full programs (L=3, N=2, Mix) on a CPU in 10 minutes; see the module docstring."""
    return _cpu("program")


def _register_cpu_presets() -> None:
    """``cpu-{task}`` (library name ``lte_cpu_{task}``) for every task type but 'program'."""
    for task_type in TASK_NAMES:
        if task_type == "program":
            continue

        def preset(task_type: str = task_type) -> TrainConfig[LearnToExecuteConfig]:
            return _cpu(task_type)

        preset.__name__ = preset.__qualname__ = f"lte_cpu_{task_type.replace('-', '_')}"
        preset.__doc__ = f"{task_type!r} on a CPU in 10 minutes (``lte_cpu``'s sizes)."
        register_preset("lte", f"cpu-{task_type}")(preset)


_register_cpu_presets()
