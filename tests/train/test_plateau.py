"""The 'plateau' learning-rate schedule: ReduceLROnPlateau's rule on the held-out loss, applied
from the next step, and kept across a resume."""

from __future__ import annotations

import pytest
import torch

from relmem.train import checkpoint as ckpt_io
from relmem.train.distributed import DistInfo
from relmem.train.loop import run
from relmem.train.trainer import Trainer

CPU = torch.device("cpu")


def lr(trainer: Trainer) -> float:
    return trainer.optimizer.param_groups[0]["lr"]


def test_the_rate_halves_after_patience_evaluations_without_improvement(tiny) -> None:
    config = tiny()
    config.optim.schedule, config.optim.plateau_patience = "plateau", 2
    trainer = Trainer(config, "nth-farthest", DistInfo(), CPU, [])
    start = lr(trainer)
    # torch's rule: no relative improvement of 1e-4 for more than `patience` evaluations
    reference = torch.optim.lr_scheduler.ReduceLROnPlateau(
        torch.optim.SGD([torch.zeros(1)], lr=start), factor=0.5, patience=2
    )
    for loss in [1.0, 0.9, 0.89995, 0.95, 0.91, 0.92, 0.93, 0.8, 0.85, 0.85, 0.85, 0.85]:
        trainer.plateau(loss)
        reference.step(loss)
        assert lr(trainer) == pytest.approx(reference.get_last_lr()[0]), loss
    assert lr(trainer) == pytest.approx(start / 4)
    assert trainer.scheduler.lr_lambdas[0](1) == pytest.approx(0.25)  # and the next steps


def test_reductions_survive_a_resume(tiny, tmp_path) -> None:
    config = tiny(steps=4, eval_every=2, checkpoint_every=2)
    config.optim.schedule, config.optim.plateau_patience = "plateau", 0
    trainer = Trainer(config, "nth-farthest", DistInfo(), CPU, [])
    trainer.plateau(1.0)
    trainer.plateau(2.0)  # patience 0: halved
    trainer.save()
    trainer.release()  # the run directory's lock, as the loop does when a run ends
    state = ckpt_io.load_train_state(ckpt_io.resolve_checkpoint(tmp_path / "run"))
    assert state["lr_scale"] == 0.5 and state["plateau_best"] == 1.0
    resumed = tiny(steps=4, resume=tmp_path / "run")
    resumed.optim.schedule, resumed.optim.plateau_patience = "plateau", 0
    again = Trainer(resumed, "nth-farthest", DistInfo(), CPU, [])
    assert again.progress.lr_scale == 0.5
    assert lr(again) == pytest.approx(config.optim.lr / 2)
    assert again.scheduler.lr_lambdas[0](3) == pytest.approx(0.5)
    again.release()
    result = run(resumed, "nth-farthest")
    assert result.status == "completed"


def test_bad_plateau_settings_are_named(tiny) -> None:
    config = tiny()
    with pytest.raises(ValueError, match=r"optim.plateau_factor must lie in \(0, 1\), got 1.5"):
        type(config.optim)(schedule="plateau", plateau_factor=1.5)
    with pytest.raises(ValueError, match="optim.plateau_patience must be >= 0"):
        type(config.optim)(schedule="plateau", plateau_patience=-1)
