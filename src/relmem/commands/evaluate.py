"""``relmem eval RUN_DIR``: the held-out metric of a trained run, broken down by group.

The metric is the task's primary one: accuracy by rank for Nth Farthest, bit errors per
sequence by pattern length (and repeat count) or item count for the copy tasks, validation
and test perplexity for a language model (a task's further held-out sets, its
``more_held_out``, follow the held-out line). A task with a breakdown set (Learning to
Execute: every length and nesting) is broken down on that set. A run that keeps its best
weights (``checkpoints/best``) is evaluated there unless ``--checkpoint`` says otherwise.

A run of an RL task (``boxworld``, ``minipacman``) plays ``--episodes`` test levels (a fixed
seeded set, default 1000, disjoint from the validation levels that picked its best weights)
with its agent and with a uniform random policy, and reports the share solved, the mean return
with its standard error and the mean episode length of each.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Literal

import torch
import tyro

from relmem.commands.errors import describe_error
from relmem.files import FileRefused, file_digest, open_regular, read_json
from relmem.tasks.base import MetricSpec
from relmem.tasks.reading.documents import read_held_out_articles
from relmem.tasks.reading.ranking import Ranker, check_ranker_weight
from relmem.tasks.reading.task import Reading
from relmem.tasks.registry import get_task
from relmem.train.checkpoint import (
    BEST_NAME,
    CHECKPOINT_DIR,
    LATEST_FILE,
    MAX_META_BYTES,
    META_FILE,
    CheckpointError,
)
from relmem.train.distributed import resolve_device
from relmem.train.evaluation import evaluate
from relmem.train.runs import (
    MAX_PARAMETERS,
    MAX_RUN_JSON_BYTES,
    SUMMARY_FILE,
    load_run_config,
    load_trained,
    write_json,
)

PREDICTIONS_INFIX = "-predictions-"  # in RECORD-predictions-DATA.json (_predictions_path)


@dataclass
class EvalArgs:
    """Evaluate a run on its task's fixed held-out set.

    Attributes:
        run_dir: the run directory written by ``relmem train``.
        checkpoint: a checkpoint directory to evaluate instead of the run's best (if it keeps
            one) or latest.
        device: auto, cpu, cuda or mps.
        test_size: held-out sequences of a supervised run (None: the run's own setting; an RL
            run refuses it).
        json_out: where to write the result (None: ``RUN_DIR/eval.json``); a task's official
            predictions go beside it, ``RECORD-predictions-DATA.json`` (``DATA``: ``held-out``,
            or the stem of ``--data``'s file).
        max_parameters: refuse to build a model larger than this (a config.json from
            elsewhere cannot make the command allocate without bound).
        episodes: test episodes of an RL run, at least 2 (its levels are seeded by the run's
            ``task.eval_seed``).
        data: a file to evaluate on instead of the run's held-out set, for a task that reads
            one (``squad``: any SQuAD-layout file; ``docs/reading.md``).
        document: ``article`` (a reader): also answer each held-out question from its whole
            article, the ``--paragraphs`` best ranked paragraphs of it read, and report
            those figures beside the paragraph's (``docs/reading.md`` §7).
        paragraphs: with ``--document article``, the paragraphs read per question (0: all).
        ranker: a reader: what ranks an article's paragraphs (``--task.ranker``; None: the
            run's own; ``bm25`` reads as every run before 2026-11-29 was read).
        ranker_weight: a reader: how much the ranker's word weighs when the answer is chosen
            among paragraphs (``--task.ranker-weight``; None: the run's own; 0: the reader's
            choice alone, as every run was read before 2026-11-29).
    """

    run_dir: Annotated[Path, tyro.conf.Positional]
    checkpoint: Path | None = None
    device: str = "auto"
    test_size: int | None = None
    json_out: Path | None = None
    max_parameters: int = MAX_PARAMETERS
    episodes: int = 1000
    data: Path | None = None
    document: Literal["paragraph", "article"] = "paragraph"
    paragraphs: int = 4
    ranker: Ranker | None = None
    ranker_weight: float | None = None


def main(argv: list[str]) -> int:
    """Entry point of ``relmem eval``; prints a table and writes ``eval.json``."""
    try:
        args = tyro.cli(EvalArgs, args=argv, prog="relmem eval")
    except SystemExit as exc:  # tyro has printed help or a boxed error message
        return int(exc.code or 0)
    try:
        _check_record_path(args)  # before the work
        if args.paragraphs < 0:
            raise ValueError(f"--paragraphs {args.paragraphs}: read at least 1 (0 reads all)")
        if get_task(load_run_config(args.run_dir)[0]).trainer is not None:
            return _evaluate_rl(args)
        device = resolve_device(args.device)
        config, task_name, task, model, ckpt = load_trained(
            args.run_dir, args.checkpoint, device, args.max_parameters, prefer_best=True
        )
        step = _step_of(ckpt)  # now: a running trainer may prune the checkpoint meanwhile
        if args.ranker is not None:  # before the task is built: its rows are ranked then
            if not hasattr(config.task, "ranker"):
                raise ValueError(f"--ranker: {task_name} runs rank no paragraphs")
            config.task.ranker = args.ranker
        if args.test_size is not None or args.data is not None or args.ranker is not None:
            if args.test_size is not None and args.test_size < 1:
                raise ValueError(f"--test-size must be >= 1, got {args.test_size}")
            if args.test_size is not None:
                config.task.test_size = args.test_size
            if args.data is not None:
                if not hasattr(config.task, "dev_file"):
                    raise ValueError(f"--data: {task_name} runs read no data file")
                try:  # named as the user gave it (the task would call it --task.dev-file)
                    os.close(open_regular(args.data))
                except FileRefused as exc:
                    raise ValueError(f"--data {exc}; pass a {task_name} data file") from None
                config.task.dev_file = args.data.expanduser().absolute()
            task = get_task(task_name).build(config.task)
        if device.type == "cpu" and isinstance(config.cpu_threads, int):
            # the run's own thread count: more threads than it trained with spin against
            # other work on a busy machine (a squad run's token steps are too small to share)
            torch.set_num_threads(config.cpu_threads)
        if args.document == "article" and not isinstance(task, Reading):
            raise ValueError(f"--document article: {task_name} runs read no documents")
        if args.ranker_weight is not None:
            if not isinstance(task, Reading):
                raise ValueError(f"--ranker-weight: {task_name} runs choose among no paragraphs")
            check_ranker_weight(args.ranker_weight, "--ranker-weight")
            task.config = replace(task.config, ranker_weight=args.ranker_weight)
        held_out = task.held_out(device)
        result = evaluate(model, task, held_out, progress=True, predictions=True)
        answers = result.pop("predictions")  # of the same forward passes as the metrics
        official = None if answers is None else task.report(answers, held_out)
        more = {name: evaluate(model, task, b) for name, b in task.more_held_out(device).items()}
        levels = task.breakdown(device)
        breakdown = None if levels is None else evaluate(model, task, levels)
        article = None
        if isinstance(task, Reading) and args.document == "article":
            article = read_held_out_articles(task, model, args.paragraphs, progress=True)
    except (ValueError, TypeError, KeyError, CheckpointError, OSError) as exc:
        return _error(describe_error(exc, "--checkpoint"))
    metric = task.metric
    if not math.isfinite(result["loss"]):
        print(
            "relmem eval: warning: the held-out loss is not finite: the weights or the outputs "
            "hold NaN or infinities, and the figures below mean nothing",
            file=sys.stderr,
        )
    print(f"{task_name} / {config.model}, checkpoint {ckpt} (step {step})")
    note = (
        None
        if args.checkpoint is not None
        else _later_weights_note(args.run_dir, ckpt, step, metric)
    )
    if note is not None:
        print(note, file=sys.stderr)
    # a stateful task's held-out set is a few long rows of one stream, walked in windows
    unit = "rows of the split" if task.stateful else "sequences"
    print(
        f"held-out {metric.description} {metric.format(result[metric.name])} on "
        f"{result['count']} {unit}, loss {result['loss']:.4f}"
    )
    for extra in task.extra_metrics:
        print(f"held-out {extra.description} {extra.format(result[extra.name])}")
    for name, extra in more.items():
        shown = metric.format(extra[metric.name])
        print(f"{name} {metric.description} {shown}, loss {extra['loss']:.4f}")
    groups = result["groups"] if breakdown is None else breakdown["groups"]
    where = "" if breakdown is None else f" ({breakdown['count']} other sequences)"
    if groups:
        print(f"by {task.group_name}{where}:")
    for group, value in sorted(groups.items()):
        print(f"  {task.group_label(group):28s} {metric.format(value):>8s}")
    predictions = _predictions_path(args)
    if official is not None:
        _print_official(official)
        if (failed := _write_predictions(predictions, answers)) is not None:
            return _error(failed)
    article_fields = {}
    if article is not None:
        reading, article_official = article
        read = "all the paragraphs" if reading.paragraphs == 0 else f"the {reading.paragraphs} best"
        print(
            f"article-level: each question answered from {read} of its article's paragraphs "
            f"({task.config.ranker} ranked; {reading.articles} articles); its own paragraph "
            f"among those read for {reading.recall:.1%} of the answerable questions"
        )
        _print_official(article_official)
        article_predictions = _predictions_path(args, "-article")
        if (failed := _write_predictions(article_predictions, reading.predictions)) is not None:
            return _error(failed)
        article_fields = {
            "article": {
                "paragraphs": reading.paragraphs,
                "ranker_recall": reading.recall,
                "official": article_official,
                "predictions": article_predictions.name,
            }
        }
    fields = {
        "metric": metric.name,
        "group_name": task.group_name,
        **result,
        **({} if breakdown is None else {"breakdown": breakdown}),
        **({"more_held_out": more} if more else {}),
        **({} if official is None else {"official": official, "predictions": predictions.name}),
        **article_fields,
        **(
            {"ranker": task.config.ranker, "ranker_weight": task.config.ranker_weight}
            if isinstance(task, Reading)
            else {}
        ),
    }
    return _write_record(args, task_name, config.model, ckpt, step, fields)


def _write_predictions(path: Path, answers: dict) -> str | None:
    """Write a predictions file (saying so); the error line when it cannot be written."""
    if path.exists():
        print(f"relmem eval: replacing {path} (predictions on the same data)")
    try:
        write_json(path, answers)
    except OSError as exc:
        return f"{path} (the predictions): {exc.strerror or exc}"
    print(f"written {path}")
    return None


def _print_official(official: dict[str, dict[str, float]]) -> None:
    """The official scores' table: questions, exact match and F1, overall then by group."""
    print("official scores (the SQuAD evaluation script's):")
    print(f"  {'':28s} {'questions':>9s} {'EM':>6s} {'F1':>6s}")
    for label, scores in official.items():
        count = int(scores["total"])
        print(f"  {label:28s} {count:9d} {scores['exact_match']:6.2f} {scores['f1']:6.2f}")
        for part in ("HasAns", "NoAns"):
            if f"{part}_total" in scores and label == "all":
                em, f1 = scores[f"{part}_exact_match"], scores[f"{part}_f1"]
                print(f"  {'  ' + part:28s} {int(scores[f'{part}_total']):9d} {em:6.2f} {f1:6.2f}")


def _evaluate_rl(args: EvalArgs) -> int:
    """``relmem eval`` of an RL run: the agent and a uniform random policy on the same
    held-out levels."""
    from relmem.rl.runs import load_agent

    if args.test_size is not None:
        raise ValueError(
            "--test-size sizes a supervised task's held-out set; an RL run plays --episodes"
        )
    if args.episodes < 2:
        raise ValueError(
            f"--episodes must be >= 2 (a standard error needs two), got {args.episodes}"
        )
    device = resolve_device(args.device)
    config, task_name, task, agent, ckpt = load_agent(
        args.run_dir, args.checkpoint, device, args.max_parameters
    )
    step = _step_of(ckpt)
    seed = config.task.eval_seed
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        results = {"agent": task.evaluate(agent, args.episodes, seed)}
        results["random"] = task.evaluate(None, args.episodes, seed)
    print(f"{task_name} / {config.model}, checkpoint {ckpt} (step {step})")
    print(f"{args.episodes} test episodes (levels seeded by {seed}):")
    for who, r in results.items():
        solved = f"solved {100 * r['solved']:5.1f}%, " if "solved" in r else ""
        print(
            f"  {who:7s} {solved}return {r['return']:.3f} +- {r['return_se']:.3f} (s.e.), "
            f"length {r['length']:.1f}"
        )
    fields = {"episodes": args.episodes, "eval_seed": config.task.eval_seed, **results}
    return _write_record(args, task_name, config.model, ckpt, step, fields)


def _write_record(
    args: EvalArgs, task_name: str, model: str, checkpoint: Path, step: int, fields: dict
) -> int:
    """Write the evaluation's record (task, model, checkpoint, step, then ``fields``) as JSON
    to ``--json-out`` (default ``RUN_DIR/eval.json``); the command's exit status. The
    checkpoint is recorded relative to the run directory (``checkpoints/best``), so that the
    record means the same on another machine."""
    out = _record_path(args)
    record = {
        "task": task_name,
        "model": model,
        "checkpoint": os.path.relpath(checkpoint.resolve(), Path(args.run_dir).resolve()),
        "step": step,
        **fields,
    }
    try:
        write_json(out, record)  # atomic; NaN as null
    except OSError as exc:
        return _error(f"--json-out {out}: {exc.strerror or exc}")
    print(f"written {out}")
    return 0


def _record_path(args: EvalArgs) -> Path:
    """Where the record goes: ``--json-out``, else ``RUN_DIR/eval.json``."""
    return args.json_out or Path(args.run_dir) / "eval.json"


def _predictions_path(args: EvalArgs, reading: str = "") -> Path:
    """Where a task's official predictions go: beside the record, named after it and the data
    evaluated (``eval-predictions-held-out.json``; ``eval-predictions-FILE-SHA1.json`` for
    ``--data FILE.json``, the first 10 digits of its content's SHA-1; ``reading`` after it:
    ``-article`` for ``--document article``'s), so that an evaluation on other data, even a
    file of the same name, keeps the earlier one's."""
    out = _record_path(args)
    data = (
        "held-out"
        if args.data is None
        else f"{args.data.stem}-{file_digest(args.data, 'sha1')[:10]}"
    )
    return out.with_name(f"{out.stem}{PREDICTIONS_INFIX}{data}{reading}.json")


def _check_record_path(args: EvalArgs) -> None:
    """Refuse a record path that cannot be written, that an evaluation's predictions file is
    named like, or that holds another file (a run's ``config.json``), before the evaluation
    runs.

    Raises:
        ValueError: its folder is missing or not writable, it is named like a predictions
            file, or it is a file other than an earlier record (naming ``--json-out``).
    """
    out = _record_path(args)
    if PREDICTIONS_INFIX in out.name:
        raise ValueError(
            f"--json-out {out}: files named RECORD{PREDICTIONS_INFIX}DATA.json hold "
            "evaluations' predictions, and the record would overwrite one; name it otherwise"
        )
    if out.exists() and not _is_record(out):
        raise ValueError(
            f"--json-out {out} exists and is not an evaluation record (a JSON object with the "
            "task, model, checkpoint and step relmem eval writes); it is never replaced: "
            "choose another path"
        )
    if args.json_out is None and not out.parent.is_dir():
        return  # no run directory: reading the run says so
    if not out.parent.is_dir():
        raise ValueError(f"--json-out {out}: {out.parent} is no directory")
    if not os.access(out.parent, os.W_OK):
        given = "" if args.json_out is not None else " (the run directory's eval.json)"
        raise ValueError(
            f"--json-out {out}{given}: {out.parent} is not writable; pass --json-out elsewhere"
        )


def _is_record(path: Path) -> bool:
    """Whether ``path`` holds an earlier evaluation's record (which a new one replaces)."""
    try:
        record = read_json(path, MAX_META_BYTES)
    except FileRefused:
        return False
    return isinstance(record, dict) and {"task", "model", "checkpoint", "step"} <= set(record)


def _later_weights_note(run_dir: Path, ckpt: Path, step: int, metric: MetricSpec) -> str | None:
    """Where a run's last weights are, when ``ckpt`` (read by default) is its best copy and the
    run ended later with a better held-out figure: an evaluation off the evaluation grid (a
    time limit, a last step between evaluations) never replaces the best copy (``docs/runs.md``
    §1), so a time-limited run's summary can beat what ``relmem eval`` reads. None otherwise,
    or when the run's ``summary.json`` cannot be read."""
    if ckpt.name != BEST_NAME:
        return None
    try:
        summary = read_json(run_dir / SUMMARY_FILE, MAX_RUN_JSON_BYTES)
    except (ValueError, OSError):
        return None
    if not isinstance(summary, dict):
        return None
    end_step = summary.get("held_out_step")
    end = summary.get(f"held_out_{metric.name}")
    best = summary.get(f"best_held_out_{metric.name}")
    if not (
        isinstance(end_step, int)
        and end_step > step
        and isinstance(end, float | int)
        and isinstance(best, float | int)
        and (end > best if metric.higher_is_better else end < best)
    ):
        return None
    latest = run_dir / CHECKPOINT_DIR / LATEST_FILE
    return (
        f"relmem eval: note: this reads the best copy (step {step}, held-out "
        f"{metric.description} {metric.format(best)} on the evaluation grid); the run ended "
        f"at step {end_step} with {metric.format(end)}, an evaluation off the grid, which never "
        f"replaces the best copy: --checkpoint {latest} reads those weights"
    )


def _step_of(ckpt: Path) -> int:
    """The step recorded in ``ckpt``'s ``meta.json``.

    Raises:
        CheckpointError: the file is gone (pruned by a running trainer) or has no step.
    """
    meta = ckpt / META_FILE
    try:
        step = read_json(meta, MAX_META_BYTES)["step"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"cannot read the step of {ckpt} from {meta} ({exc})") from exc
    if not isinstance(step, int):
        raise CheckpointError(f"{meta}: step must be an integer, got {step!r}")
    return step


def _error(message: str) -> int:
    print(f"relmem eval: error: {message}", file=sys.stderr)
    return 2
