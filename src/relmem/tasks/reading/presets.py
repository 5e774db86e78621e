"""Presets of ``relmem train squad`` (``docs/reading.md`` §5).

- ``cpu`` (default): a reader that learns on 2 CPU cores in 30 minutes: learned 100-wide word
  vectors, a character CNN of 64 filters, GRUs of 48 units a direction (the fused document is
  96 wide), the memory controller with 16 slots of 32 and 2 read heads; training contexts cut
  at 400 tokens; batch 32, Adam 1e-3 with the gradient norm clipped at 5, evaluation every
  400 steps, a 30-minute limit, one CPU thread (the memory controller's token-by-token steps
  are too small to share between threads).
- ``paper``: MemoReader's sizes for a GPU: fixed GloVe 840B 300d vectors (read from
  ``$RELMEM_DATA/glove/glove.840B.300d.txt`` unless ``--task.embeddings`` names the file),
  a character CNN of 100 filters, GRUs of 100 units, the memory controller with 128 slots of 64
  and 4 read heads (``MemoryControllerLayer``'s defaults), whole contexts; batch 32, Adam 1e-3
  for 60,000 steps, evaluation every 2,000.
"""

from __future__ import annotations

from relmem.models import DNCModelConfig, LSTMModelConfig, RMCModelConfig
from relmem.tasks.language_model.wikitext import data_root
from relmem.tasks.reading.task import ReadingConfig
from relmem.tasks.registry import register_preset
from relmem.train.config import OptimConfig, TrainConfig


@register_preset("squad", "cpu", default=True)
def squad_cpu() -> TrainConfig[ReadingConfig]:
    """The reader at CPU sizes, 30 minutes (module docstring)."""
    return TrainConfig(
        task=ReadingConfig(),
        model="dnc",
        dnc=DNCModelConfig(memory_size=16, word_size=32, num_read_heads=2),
        rmc=RMCModelConfig(mem_slots=4, head_size=48, num_heads=2, gate_style="memory"),
        lstm=LSTMModelConfig(hidden_size=96),
        optim=OptimConfig(lr=1e-3, grad_clip=5.0),
        steps=100_000,
        batch_size=32,
        time_limit_min=30.0,
        cpu_threads=1,
        eval_every=400,
        eval_batch=32,
        log_every=50,
        checkpoint_every=400,
        tensorboard=False,
    )


@register_preset("squad", "paper")
def squad_paper() -> TrainConfig[ReadingConfig]:
    """MemoReader's sizes with GloVe 300d, for a GPU (module docstring)."""
    return TrainConfig(
        task=ReadingConfig(
            embeddings=data_root() / "glove" / "glove.840B.300d.txt",
            word_size=300,
            char_embedding=20,
            char_channels=100,
            hidden_size=100,
            max_context_tokens=None,
            attention_window=256,
        ),
        model="dnc",
        dnc=DNCModelConfig(memory_size=128, word_size=64, num_read_heads=4),
        rmc=RMCModelConfig(mem_slots=8, head_size=64, num_heads=4, gate_style="memory"),
        lstm=LSTMModelConfig(hidden_size=200),
        optim=OptimConfig(lr=1e-3, grad_clip=5.0),
        steps=60_000,
        batch_size=32,
        eval_every=2000,
        eval_batch=32,
        log_every=100,
        checkpoint_every=2000,
    )
