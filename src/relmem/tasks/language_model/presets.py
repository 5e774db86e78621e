"""Presets of the ``lm`` task: ``cpu`` (the default), ``wt2-port``, ``wt2-port-lstm``, ``paper``.

Each sets both the RMC and an LSTM, so ``--model lstm`` trains the baseline of the same preset.
"""

from __future__ import annotations

from relmem.models import LSTMModelConfig, RMCModelConfig
from relmem.tasks.language_model import wikitext
from relmem.tasks.language_model.batching import num_windows
from relmem.tasks.language_model.task import LanguageModelConfig
from relmem.tasks.registry import register_preset
from relmem.train.config import OptimConfig, TrainConfig

__all__ = ["lm_cpu", "lm_paper", "lm_wt2_port", "lm_wt2_port_lstm"]


def _windows_per_epoch(dataset: str, batch: int, bptt: int) -> int:
    """Training steps in one epoch: the windows of one of the ``batch`` rows that
    ``batchify`` cuts the release's training tokens into."""
    return num_windows(wikitext.RELEASES[dataset].tokens["train"] // batch, bptt)


@register_preset("lm", "cpu", default=True)
def lm_cpu() -> TrainConfig[LanguageModelConfig]:
    """A model that learns WikiText-2 in about 10 minutes on two CPU cores.

    RMC: 1 slot of 2 heads x 64, a 2-layer attention MLP; LSTM: 1 layer of 160 units, about
    the same number of parameters. Embedding 128, dropout 0.2, an adaptive softmax (cutoffs
    2000, 10000), batch 32, BPTT 50, Adam 2e-3, clipping 0.25.
    """
    return TrainConfig(
        task=LanguageModelConfig(
            dataset="wikitext-2",
            bptt=50,
            embedding_size=128,
            embedding_dropout=0.2,
            output_dropout=0.2,
            softmax="adaptive",
            cutoffs=(2000, 10000),
        ),
        model="rmc",
        rmc=RMCModelConfig(mem_slots=1, head_size=64, num_heads=2, attention_mlp_layers=2),
        lstm=LSTMModelConfig(hidden_size=160),
        optim=OptimConfig(lr=2e-3, grad_clip=0.25),
        steps=100_000,
        time_limit_min=10.0,
        batch_size=32,
        eval_batch=32,
        eval_every=500,
        log_every=50,
        checkpoint_every=500,
        cpu_threads=1,
        tensorboard=False,
    )


def _wt2_port(model: str, embedding_size: int) -> TrainConfig[LanguageModelConfig]:
    epoch = _windows_per_epoch("wikitext-2", 64, 100)  # 327
    return TrainConfig(
        task=LanguageModelConfig(
            dataset="wikitext-2",
            bptt=100,
            eval_rows=10,
            embedding_size=embedding_size,
            embedding_dropout=0.5 if model == "lstm" else 0.0,
            output_dropout=0.5,
        ),
        model=model,
        rmc=RMCModelConfig(
            mem_slots=1, head_size=192, num_heads=4, attention_mlp_layers=3, key_size=64
        ),
        lstm=LSTMModelConfig(hidden_size=300),
        optim=OptimConfig(lr=1e-3, grad_clip=0.1, schedule="plateau"),
        steps=100 * epoch,  # 100 epochs of WikiText-2 at batch 64, BPTT 100
        batch_size=64,
        eval_batch=64,
        eval_every=epoch,
        log_every=50,
        checkpoint_every=epoch,
    )


@register_preset("lm", "wt2-port")
def lm_wt2_port() -> TrainConfig[LanguageModelConfig]:
    """The public PyTorch port's WikiText-2 RMC (``docs/tasks.md`` §3.5), about 11 M parameters:
    embedding 192, 1 slot of 4 heads x 192, key 64, a 3-layer attention MLP, dropout before the
    softmax; Adam 1e-3 halved when the validation loss has not improved for 5 epochs, clipping
    0.1, batch 64, BPTT 100, 100 epochs (one evaluation per epoch)."""
    return _wt2_port("rmc", 192)


@register_preset("lm", "wt2-port-lstm")
def lm_wt2_port_lstm() -> TrainConfig[LanguageModelConfig]:
    """The port's LSTM baseline (``docs/tasks.md`` §3.5): embedding and hidden 300, one layer,
    dropout 0.5, tied, about 11 M parameters; training as ``wt2-port``."""
    return _wt2_port("lstm", 300)


@register_preset("lm", "paper")
def lm_paper() -> TrainConfig[LanguageModelConfig]:
    """The paper's WikiText-103 set-up (``docs/tasks.md`` §3.4): embedding 512 tied, dropout
    0.5, RMC of 1 memory of 4 heads x 625 (2500 units), a 5-layer attention MLP, 1 block;
    Adam 1e-3, clipping 0.1, BPTT 100, batch 384 (the paper's 6 GPUs x 64). The training
    length is not in the paper: 50 epochs here. The LSTM settings (one layer of 2048) are not
    the paper's."""
    epoch = _windows_per_epoch("wikitext-103", 384, 100)  # 2689
    return TrainConfig(
        task=LanguageModelConfig(dataset="wikitext-103", bptt=100, embedding_size=512),
        model="rmc",
        rmc=RMCModelConfig(mem_slots=1, head_size=625, num_heads=4, attention_mlp_layers=5),
        lstm=LSTMModelConfig(hidden_size=2048),
        optim=OptimConfig(lr=1e-3, grad_clip=0.1, eps_hat=True),  # TF's Adam (epsilon hat)
        steps=50 * epoch,  # 50 epochs of WikiText-103 at batch 384, BPTT 100
        batch_size=384,
        eval_batch=384,
        eval_every=epoch,
        log_every=100,
        checkpoint_every=1000,
    )
