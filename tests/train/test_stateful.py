"""The widened task contract in the loop: state carried across batches (and its exact resume),
token-weighted metrics with one and two processes, and the step a task is sampled at."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from processes import run_python
from safetensors.torch import load_file
from toy_tasks import EpisodeBits, EpisodeBitsConfig, StepProbe, TokenCopy, token_copy_config

from relmem.models import LSTMModelConfig
from relmem.models.heads import HeadConfig
from relmem.tasks import NthFarthestConfig, RepeatCopyConfig
from relmem.tasks.base import step_generator
from relmem.tasks.registry import get_task, list_tasks, registered
from relmem.train import checkpoint as ckpt_io
from relmem.train.distributed import DistInfo
from relmem.train.evaluation import evaluate
from relmem.train.loop import run
from relmem.train.metrics import read_metrics
from relmem.train.runs import build_model, load_trained
from relmem.train.trainer import STREAM_TRAIN

HERE = Path(__file__).resolve().parent


def episode_config(tiny, carry: bool, **overrides):
    settings = {
        "task": EpisodeBitsConfig(carry=carry),
        "model": "lstm",
        "lstm": LSTMModelConfig(hidden_size=16),
        "head": HeadConfig(),  # a per-step task: no MLP head reads it
        "steps": 300,
        "batch_size": 32,
        "eval_every": 300,
        "eval_batch": 32,
        "log_every": 50,
        "checkpoint_every": 300,
    }
    config = tiny(**(settings | overrides))
    config.optim.lr = 2e-2
    return config


@pytest.fixture
def episode_bits():
    with registered("episode-bits", EpisodeBitsConfig, EpisodeBits):
        yield


def test_registered_tasks_do_not_leak(episode_bits) -> None:
    assert "episode-bits" in list_tasks()
    with registered("other", NthFarthestConfig, StepProbe):
        assert get_task("other").build is StepProbe
    assert "other" not in list_tasks()


@pytest.mark.parametrize("carry", [True, False], ids=["carried", "dropped"])
def test_stateful_task_is_learned_only_with_the_state_carried(tiny, episode_bits, carry, device):
    """Windows 2 and 3 of an episode need the key seen in window 1: with the state carried,
    held-out accuracy nears 1; without, those windows stay at chance (about 2/3 overall)."""
    config = episode_config(tiny, carry, run_name=f"carry-{carry}", device=device.type)
    result = run(config, "episode-bits")
    accuracy = result.summary["held_out_accuracy"]
    if carry:
        assert accuracy > 0.95, accuracy
    else:
        assert accuracy < 0.8, accuracy


def test_stateful_eval_carries_state_across_the_split(tiny, episode_bits) -> None:
    """The held-out rows are walked in windows with the state carried: the same as one pass."""
    config = episode_config(tiny, True)
    task = get_task("episode-bits").build(config.task)
    model = build_model(config, task)
    held_out = task.held_out(torch.device("cpu"))
    assert held_out.inputs.shape[1] == 6 * task.spec.seq_len
    walked = evaluate(model, task, held_out, chunk=50)
    with torch.no_grad():
        logits, _ = model(held_out.inputs)
    direct = task.measure(logits, held_out)
    assert walked["accuracy"] == pytest.approx(direct["accuracy"].value().item(), abs=1e-12)
    assert walked["loss"] == pytest.approx(direct["loss"].value().item(), rel=1e-5)


def test_a_rank_without_held_out_rows_adds_nothing(tiny, episode_bits, monkeypatch) -> None:
    """Fewer held-out rows than processes (``--task.eval-rows 1`` on two ranks): the rank
    without rows adds zeros to the sums, where the RMC refused its empty batch and the run
    died at its first evaluation."""
    config = episode_config(tiny, True, model="rmc")
    task = get_task("episode-bits").build(config.task)
    model = build_model(config, task)
    one_row = task.held_out(torch.device("cpu")).select(slice(0, 1))
    shares = []  # each rank's sums before the all-reduce, which is left out here
    monkeypatch.setattr(
        "relmem.train.evaluation.all_reduce_sum", lambda t, info: shares.append(t.clone())
    )
    alone = evaluate(model, task, one_row)
    for rank in (0, 1):
        evaluate(model, task, one_row, info=DistInfo(rank=rank, world_size=2))
    assert torch.equal(shares[2], shares[0]) and not shares[4].any()  # sums; by_group between
    assert alone["loss"] > 0


def test_stateful_resume_is_exact(tiny, episode_bits, tmp_path: Path) -> None:
    """k steps, checkpoint (the carried state included), resume, k more == 2k steps."""
    run(episode_config(tiny, True, run_name="straight", steps=20), "episode-bits")
    run(episode_config(tiny, True, run_name="split", steps=10), "episode-bits")
    resumed = episode_config(tiny, True, run_name="split", steps=20, resume=tmp_path / "split")
    run(resumed, "episode-bits")
    state = ckpt_io.load_train_state(ckpt_io.resolve_checkpoint(tmp_path / "split"))
    assert [tuple(t.shape) for t in state["carried_state"]] == [(32, 1, 16), (32, 1, 16)]
    a = load_file(ckpt_io.resolve_checkpoint(tmp_path / "straight") / ckpt_io.MODEL_FILE)
    b = load_file(ckpt_io.resolve_checkpoint(tmp_path / "split") / ckpt_io.MODEL_FILE)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    straight = json.loads((tmp_path / "straight" / "summary.json").read_text())
    split = json.loads((tmp_path / "split" / "summary.json").read_text())
    assert straight["held_out_accuracy"] == split["held_out_accuracy"]


def test_a_stateful_resume_refuses_another_batch_size(tiny, episode_bits, tmp_path: Path):
    """The carried rows are places in the data: a smaller --batch-size silently kept rows
    0..B-1, a larger one failed with a cell's 'state.memory batch size mismatch'."""
    run(episode_config(tiny, True, run_name="split", steps=10), "episode-bits")
    for batch in (16, 64):
        resumed = episode_config(
            tiny, True, run_name="split", steps=20, resume=tmp_path / "split", batch_size=batch
        )
        with pytest.raises(ValueError, match="resume it with --batch-size 32"):
            run(resumed, "episode-bits")


def test_sample_sees_the_step_also_after_resume(tiny, tmp_path: Path) -> None:
    with registered("step-probe", NthFarthestConfig, StepProbe):
        StepProbe.calls = []
        run(tiny(steps=6, eval_every=3, eval_batch=48, checkpoint_every=3), "step-probe")
        assert [s for b, s in StepProbe.calls if b == 32] == [0, 1, 2, 3, 4, 5]
        assert [s for b, s in StepProbe.calls if b == 48] == [3, 6]  # the fresh eval batches
        StepProbe.calls = []
        resume = ckpt_io.list_checkpoints(tmp_path / "run")[0]
        run(tiny(steps=6, eval_every=3, eval_batch=48, resume=resume), "step-probe")
        assert [s for b, s in StepProbe.calls if b == 32] == [3, 4, 5]


def _direct(config, run_dir: Path | None, task) -> tuple[float, float]:
    """Token-weighted bit errors of the run's final model on the held-out set, and of the
    initial model on step 0's batch, computed in one pass each."""
    model = build_model(config, task)
    first = task.sample(config.batch_size, step_generator(torch.device("cpu"), 0, STREAM_TRAIN, 0))
    with torch.no_grad():
        initial = task.measure(model(first.inputs, lengths=first.lengths)[0], first)
        if run_dir is not None:
            model = load_trained(run_dir)[3]
        held_out = task.held_out(torch.device("cpu"))
        final = task.measure(model(held_out.inputs, lengths=held_out.lengths)[0], held_out)
    assert not torch.equal(held_out.mask.sum(1), held_out.mask[:1].sum(1).expand(held_out.size))

    def rate(measure) -> float:  # in float64, as the trainer sums
        return (measure.total.double().sum() / measure.count.double().sum()).item()

    return rate(final["bit_errors"]), rate(initial["bit_errors"])


def test_token_weighted_metrics_match_a_direct_computation(tmp_path: Path) -> None:
    """Uneven scored steps per sequence; chunked evaluation and logged training metrics are
    Σ total / Σ count, with one process and with two (gloo)."""
    script = [str(HERE / "toy_tasks.py"), str(tmp_path)]
    single = run_python([*script, "single"], timeout=120)
    assert single.returncode == 0, single.stderr
    ddp = run_python([*script, "ddp"], processes=2, timeout=180)
    assert ddp.returncode == 0, ddp.stdout + ddp.stderr
    with registered("token-copy", RepeatCopyConfig, TokenCopy):
        for name in ("single", "ddp"):
            config = token_copy_config(tmp_path, name)
            task = get_task("token-copy").build(config.task)
            final, initial = _direct(config, tmp_path / name, task)
            summary = json.loads((tmp_path / name / "summary.json").read_text())
            assert summary["held_out_bit_errors"] == pytest.approx(final, rel=1e-9), name
            chunked = evaluate(
                load_trained(tmp_path / name)[3], task, task.held_out(torch.device("cpu")), chunk=5
            )
            assert chunked["bit_errors"] == pytest.approx(final, rel=1e-9), name
            first = read_metrics(tmp_path / name / "metrics.jsonl")[0]
            assert first["step"] == 1
            assert first["train/bit_errors"] == pytest.approx(initial, rel=1e-9), name
