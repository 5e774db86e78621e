"""Every GPU measurement the project owes, in one command of at most nine minutes (issue 36).

``scripts/gpu-check OUT`` runs the parts below one after another, each in its own process with
its own time budget: a part that hangs or runs long is killed when its budget is spent and the
next one starts, so one part cannot eat the rest. What each part found goes to
``OUT/summary.json``; everything the parts printed to ``OUT/log.txt``. ``--tiny --device cpu``
runs every part at toy sizes on the CPU (the dry run CI does, ``tests/test_gpu_check.py``).

Parts (budgets in seconds on one H100 or H200; :func:`parts` lists them, in order):

================== ====== ================================================================
env                  20   Python, torch, CUDA, cuDNN, the GPU and ``nvidia-smi``
tests               150   ``pytest -m gpu tests`` (8 workers where pytest-xdist is there):
                          the GPU tests, ``tests/rl``'s and every test that takes the
                          ``device`` fixture (``tests/conftest.py``), on CUDA
bench-<config>    30-45   ``relmem bench --device cuda`` on each configuration of
                          ``relmem.benchmarking.configs``: reference, fast, CUDA graph,
                          CUDA graph + bf16, cuDNN LSTM, matmul floor (small, nth_farthest,
                          wikitext2_port 30; lte 35; lm_paper 45, fewer rounds)
precision            40   ``benchmarks/rmc_precision.py --device cuda --sdpa``: §4.12's
                          failing cases against float64, per SDPA backend
                          (``docs/performance.md`` §4.15)
paper-nth-farthest   45   600 steps of ``relmem train nth-farthest --preset paper``
paper-lm-wt2-port    70   100 steps of ``relmem train lm --preset wt2-port``
paper-lte            45   300 steps of ``relmem train lte --preset paper``
paper-boxworld       60   20 steps (25,600 frames) of ``relmem train boxworld --preset paper``,
                          100 evaluation episodes
bench-compile        75   ``relmem bench --compile --only fast+compile`` on small,
                          nth_farthest and wikitext2_port
================== ====== ================================================================

Each slice reports its steps/s (``sequences_per_s``), tokens/s or frames/s, the median of
the logged windows after the first, and the held-out metric at its end; a slice also stops
itself (``--time-limit-min``) 20 s before its budget, evaluating and checkpointing. The budgets
add up to 675 s; ``--total-budget`` (540 s) caps the whole run, shortening or skipping the last
parts when earlier ones ran long. A new part is one more :class:`Part` in :func:`parts`, and a
new ``paper`` slice one more :class:`Slice` in :data:`SLICES` (the HOOK there says how to add
the reading task's slice for an example of one with its own data).

The LM slice needs WikiText-2, which the device machine cannot download: ``scripts/gpu-wheels``
copies it into ``.gpu-data/`` when this machine has it; otherwise the slice trains on a
synthetic corpus of WikiText-2's vocabulary and size (:func:`synthetic_corpus`: its tokens/s
are the preset's, its perplexity means nothing) and the summary says so.

How to call it with the device tool (``/work/.library/device/README.md``), after
``scripts/gpu-wheels`` here::

    run(command="python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir
                 --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site ||
                 exit; scripts/gpu-check $OUT",
        carry=[".whl", ".gpu-data"], timeout_s=600)

(one line; ``carry`` may name ``.gpu-data`` when ``scripts/gpu-wheels`` made none: the tool
reports it as not carried). At most eight files come back from ``$OUT``, so the parts' own files
are gathered into six: summary.json, log.txt, bench.json, runs.json, junit.xml, precision.json.

The dry run (``--device cpu --tiny``) runs three parts side by side (``--jobs``): its timings
mean nothing, its wall time is CI's. It skips ``bench-lm_paper`` (the 76 M-parameter model
alone takes half a CPU minute) and runs ``bench-compile`` with ``TORCHDYNAMO_DISABLE=1``
(inductor's build takes minutes on a CPU).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO / "src") not in sys.path:  # the device machine runs the checkout, not installed
    sys.path.insert(0, str(REPO / "src"))
TOTAL_BUDGET_S = 540.0
LOG_TAIL_BYTES = 400_000  # of each part's output, in log.txt (a file comes back up to 16 MiB)
STOP_GRACE_S = 10.0  # between SIGINT (a trainer checkpoints and exits) and SIGKILL
WIKITEXT2 = {"vocabulary": 33_278, "train": 2_088_628, "valid": 217_646, "test": 245_569}

ENV_SNIPPET = r"""
import json, shutil, subprocess, sys
import torch
from relmem.env_info import machine_info
device = torch.device(sys.argv[1])
info = {"machine": machine_info(device), "cuda_available": torch.cuda.is_available(),
        "torch_cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}
if device.type == "cuda":
    p = torch.cuda.get_device_properties(device)
    info["gpu"] = {"name": p.name, "capability": f"{p.major}.{p.minor}",
                   "multiprocessors": p.multi_processor_count,
                   "memory_gib": round(p.total_memory / 2**30, 1)}
if shutil.which("nvidia-smi"):
    smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=20)
    print(smi.stdout)
    query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
             "--format=csv,noheader"]
    info["nvidia_smi"] = subprocess.run(query, capture_output=True, text=True,
                                        timeout=20).stdout.strip()
import importlib.metadata as md
info["packages"] = {}
for name in ("torch", "triton", "numpy", "tyro", "torchrl", "tensordict", "gymnasium", "pytest"):
    try:
        info["packages"][name] = md.version(name)
    except md.PackageNotFoundError:
        info["packages"][name] = None
print("GPU_CHECK_JSON " + json.dumps(info))
"""


@dataclass
class Context:
    """What every part's command and reader need.

    Attributes:
        out: the folder the results go to (``$OUT`` on the device machine).
        work: scratch space for the parts' own files (run directories, checkpoints).
        device: 'cuda' or 'cpu'.
        tiny: toy sizes (the CPU dry run).
        python: the interpreter the parts run under.
    """

    out: Path
    work: Path
    device: str
    tiny: bool
    python: str = sys.executable


@dataclass
class Part:
    """One measurement: a command with a time budget, and what to read from it afterwards.

    Attributes:
        name: its key in the summary.
        budget_s: seconds it may take on the GPU (a tiny run gets the same).
        command: the command line, from the context.
        read: the summary's findings, from the context and the part's captured output; may
            raise (the summary then records the error).
        prepare: run before the command (writes inputs such as a corpus).
        env: extra environment variables, from the context (recorded in the summary).
        skip: a reason not to run it in this context (None: run it).
    """

    name: str
    budget_s: float
    command: Callable[[Context], list[str]]
    read: Callable[[Context, str], dict[str, Any]] = lambda ctx, output: {}
    prepare: Callable[[Context], Any] | None = None
    env: Callable[[Context], dict[str, str]] = lambda ctx: {}
    skip: Callable[[Context], str | None] = lambda ctx: None


# ---------------------------------------------------------------------------------------------
# env


def _read_env(ctx: Context, output: str) -> dict[str, Any]:
    lines = [x for x in output.splitlines() if x.startswith("GPU_CHECK_JSON ")]
    if not lines:
        raise ValueError("the env snippet printed no GPU_CHECK_JSON line")
    return json.loads(lines[-1].removeprefix("GPU_CHECK_JSON "))


# ---------------------------------------------------------------------------------------------
# tests


def _test_command(ctx: Context) -> list[str]:
    argv = [ctx.python, "-m", "pytest", "-m", "gpu", "-q", "-rfE", "-p", "no:cacheprovider"]
    argv += [f"--junitxml={ctx.work / 'junit.xml'}", "--timeout=120", "--durations=15"]
    if ctx.tiny:  # collecting the whole suite takes a CPU minute: one file's GPU tests
        return [*argv, "tests/dnc/test_dnc_core.py"]
    with contextlib.suppress(ImportError):
        import xdist  # noqa: F401  (pytest-xdist: the torch.compile tests compile in parallel)

        argv += ["-n", "8"]
    return [*argv, "tests"]


def _read_tests(ctx: Context, output: str) -> dict[str, Any]:
    path = ctx.work / "junit.xml"
    shutil.copy(path, ctx.out / "junit.xml")
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failed = []
    for case in ElementTree.parse(path).iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            counts["failed" if case.find("failure") is not None else "errors"] += 1
            node = case.find("failure") if case.find("failure") is not None else case.find("error")
            failed.append({"test": name, "message": (node.get("message") or "")[:300]})
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return {**counts, "failures": failed}


# ---------------------------------------------------------------------------------------------
# bench


TINY_BENCH = ["--steps", "2", "--batch", "2", "--repeat", "1", "--warmup", "0"]
TINY_IMPLEMENTATIONS = ["reference", "fast", "matmul-floor"]  # not fused: a C++ build
# relmem.benchmarking.configs.CONFIGS' names (a test holds them equal), written out so that the
# script starts its first part without importing torch
BENCH_CONFIGS = ("small", "wikitext2_port", "nth_farthest", "lte", "lm_paper")
BENCH_BUDGETS = {"lte": 35.0, "lm_paper": 45.0}
COMPILE_CONFIGS = ["small", "nth_farthest", "wikitext2_port"]


def _bench_command(configs: list[str], compile_only: bool) -> Callable[[Context], list[str]]:
    def command(ctx: Context) -> list[str]:
        name = "compile" if compile_only else configs[0]
        argv = [ctx.python, "-m", "relmem", "bench", "--device", ctx.device, "--configs"]
        argv += [*(configs[:1] if ctx.tiny else configs), "--out", str(ctx.work / f"bench-{name}")]
        if compile_only:
            argv += ["--compile", "--only", "fast+compile"]
        if ctx.tiny:
            argv += TINY_BENCH
            if not compile_only:
                argv += ["--only", *TINY_IMPLEMENTATIONS]
        else:  # lm_paper's reference takes most of a second a pass: fewer rounds
            repeat, warmup = ("5", "2") if configs == ["lm_paper"] else ("10", "3")
            argv += ["--repeat", repeat, "--warmup", warmup]
        return argv

    return command


def _read_bench(name: str) -> Callable[[Context, str], dict[str, Any]]:
    def read(ctx: Context, output: str) -> dict[str, Any]:
        paths = sorted((ctx.work / f"bench-{name}").glob("bench-*.json"))
        if not paths:  # stopped for its budget: the rows it printed as it went
            return _bench_rows(output)
        payload = json.loads(paths[-1].read_text())
        _append_json(ctx.out / "bench.json", payload)
        found: dict[str, Any] = {}
        for record in payload["results"]:
            per = found.setdefault(record["config"], {"T": record["steps"], "B": record["batch"]})
            per[record["implementation"]] = {
                "fwd_ms": record["forward"]["median_ms"],
                "fwd_bwd_ms": record["train"]["median_ms"],
                "items_per_s": record["train"]["items_per_s"],
            }
        for per in found.values():
            _bench_ratios(per)
        return found

    return read


def _bench_rows(output: str) -> dict[str, Any]:
    """The timings in ``relmem bench``'s progress rows (config, implementation, forward ms,
    forward + backward ms, items/s), for a run stopped before it wrote its JSON file."""
    from relmem.benchmarking.configs import CONFIGS, IMPLEMENTATIONS

    found: dict[str, Any] = {"partial": True}
    for line in output.splitlines():
        words = line.split()
        if len(words) == 5 and words[0] in CONFIGS and words[1] in IMPLEMENTATIONS:
            found.setdefault(words[0], {})[words[1]] = {
                "fwd_ms": float(words[2]),
                "fwd_bwd_ms": float(words[3]),
                "items_per_s": float(words[4]),
            }
    for config, per in found.items():
        if config != "partial":
            _bench_ratios(per)
    return found


def _bench_ratios(per: dict[str, Any]) -> None:
    """Add issue 36's ratios to one configuration's timings: the best RMC path over the
    matmul floor and over the cuDNN LSTM of equal parameters, and the reference over the CUDA
    graph (forward + backward medians)."""
    ms = {k: v["fwd_bwd_ms"] for k, v in per.items() if isinstance(v, dict)}
    rmc = {k: v for k, v in ms.items() if k not in ("lstm-params", "lstm-width", "matmul-floor")}
    if rmc:
        best = min(rmc, key=rmc.__getitem__)
        per["best_rmc"] = best
        if "matmul-floor" in ms:
            per["best_over_floor"] = rmc[best] / ms["matmul-floor"]
        if "lstm-params" in ms:
            per["best_over_lstm_params"] = rmc[best] / ms["lstm-params"]
    if "reference" in ms and "fast+graph" in ms:
        per["reference_over_graph"] = ms["reference"] / ms["fast+graph"]


# ---------------------------------------------------------------------------------------------
# precision (docs/performance.md §4.15)


PRECISION_CASES = ["query-memory-b2", "output-gate", "matrix-input", "blocks-3"]


def _precision_command(ctx: Context) -> list[str]:
    argv = [ctx.python, "benchmarks/rmc_precision.py", "--device", ctx.device]
    argv += ["--json", str(ctx.work / "precision.json")]
    if ctx.tiny:
        return [
            *argv,
            "--cases",
            "default",
            "--seeds",
            "0",
            "--steps",
            "2",
            "--batch",
            "2",
            "--no-fused",
        ]
    return [*argv, "--sdpa", "--seeds", "0", "1", "2", "--cases", *PRECISION_CASES]


def _read_precision(ctx: Context, output: str) -> dict[str, Any]:
    shutil.copy(ctx.work / "precision.json", ctx.out / "precision.json")
    records = json.loads((ctx.out / "precision.json").read_text())["records"]
    worst: dict[str, float] = {}
    for r in records:
        if "error" not in r:
            key = f"{r['case']} {r['run']} {r['sdpa']}"
            error = max(r["input grad"], r["initial memory grad"], r["worst param grad"])
            worst[key] = max(worst.get(key, 0.0), error)
    return {"worst_gradient_error": worst}


# ---------------------------------------------------------------------------------------------
# paper presets


@dataclass(frozen=True)
class Slice:
    """A fixed-length slice of a ``paper`` preset: ``relmem train TASK --preset PRESET``.

    Attributes:
        task, preset: what to train.
        steps: optimiser steps on the GPU (the slice's length).
        tiny_steps: the same on the CPU dry run.
        overrides: options for both (held-out sets cut to what fits the budget).
        tiny_overrides: options for the dry run only (toy batches and sets).
        rate: the ``perf/`` metric reported ('tokens_per_s', 'sequences_per_s',
            'frames_per_s').
    """

    task: str
    preset: str
    steps: int
    tiny_steps: int
    overrides: tuple[str, ...] = ()
    tiny_overrides: tuple[str, ...] = ()
    rate: str = "sequences_per_s"


SLICES: dict[str, Slice] = {
    "paper-nth-farthest": Slice(
        "nth-farthest",
        "paper",
        steps=600,
        tiny_steps=2,
        tiny_overrides=("--batch-size", "8", "--eval-batch", "8", "--task.test-size", "16"),
    ),
    "paper-lm-wt2-port": Slice(
        "lm",
        "wt2-port",
        steps=100,
        tiny_steps=2,
        tiny_overrides=("--batch-size", "2", "--eval-batch", "2", "--task.bptt", "8"),
        rate="tokens_per_s",
    ),
    "paper-lte": Slice(
        "lte",
        "paper",
        steps=300,
        tiny_steps=2,
        tiny_overrides=("--batch-size", "4", "--eval-batch", "8", "--task.test-size", "8"),
    ),
    "paper-boxworld": Slice(
        "boxworld",
        "paper",
        steps=20,
        tiny_steps=2,
        # 1000 evaluation episodes take minutes: 100 give the metric to about ±5%
        overrides=("--task.eval-episodes", "100"),
        tiny_overrides=(
            "--batch-size",
            "2",
            "--task.unroll",
            "5",
            "--task.collectors",
            "1",
            "--task.eval-episodes",
            "2",
        ),
        rate="frames_per_s",
    ),
    # the reader at the paper's sizes, without GloVe (not on the device machine: learned 300-d
    # vectors cost the same), on SQuAD's dev file split by article when scripts/gpu-wheels
    # staged it, else on the tests' sample (throughput only); _squad_args gives the data
    "paper-squad": Slice(
        "squad",
        "paper",
        steps=40,
        tiny_steps=2,
        overrides=("--task.embeddings", "None", "--task.test-size", "300"),
        tiny_overrides=(
            "--batch-size",
            "4",
            "--task.word-size",
            "16",
            "--task.hidden-size",
            "8",
            "--task.min-char-count",
            "1",
            "--dnc.memory-size",
            "8",
            "--dnc.word-size",
            "8",
        ),
    ),
}
SLICE_BUDGETS = {"paper-nth-farthest": 45.0, "paper-lm-wt2-port": 70.0, "paper-lte": 45.0}
SLICE_BUDGETS["paper-boxworld"] = 60.0
SLICE_BUDGETS["paper-squad"] = 75.0


def synthetic_corpus(folder: Path, vocabulary: int, sizes: dict[str, int], seed: int = 0) -> Path:
    """Write ``wiki.{train,valid,test}.tokens`` of Zipf-distributed words ``w0 .. wV-1`` in
    lines of 20: a stand-in for WikiText with its vocabulary and length (throughput only).

    Args:
        folder: created if missing.
        vocabulary: V; every word appears in the training split (so the vocabulary is V + 1
            with ``<eos>``).
        sizes: tokens per split name ('train', 'valid', 'test').
        seed: of the draws.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    weights = 1.0 / np.arange(1, vocabulary + 1)
    weights /= weights.sum()
    for split, count in sizes.items():
        ids = rng.choice(vocabulary, size=count, p=weights)
        if split == "train":
            ids[:vocabulary] = np.arange(vocabulary)  # every word once at least
        words = np.char.add("w", ids.astype(str))
        lines = [" ".join(words[i : i + 20]) for i in range(0, count, 20)]
        (folder / f"wiki.{split}.tokens").write_text("\n".join(lines) + "\n")
    return folder


def _lm_corpus(ctx: Context) -> Path:
    """The folder of WikiText-2 for the LM slice: staged by ``scripts/gpu-wheels``, in
    ``$RELMEM_DATA`` or ``~/.cache/relmem``; else (and always with --tiny) a synthetic one."""
    if not ctx.tiny:
        data = os.environ.get("RELMEM_DATA")
        roots = [REPO / ".gpu-data", *([Path(data)] if data else []), Path.home() / ".cache/relmem"]
        for root in roots:
            folder = root / "wikitext-2"
            if all((folder / f"wiki.{s}.tokens").is_file() for s in ("train", "valid", "test")):
                return folder
    folder = ctx.work / "synthetic-wikitext-2"
    if not folder.is_dir():
        if ctx.tiny:
            synthetic_corpus(folder, 200, {"train": 4000, "valid": 400, "test": 400})
        else:  # WikiText-2's vocabulary and training length; short held-out splits
            sizes = {"train": WIKITEXT2["train"], "valid": 20_000, "test": 20_000}
            synthetic_corpus(folder, WIKITEXT2["vocabulary"], sizes)
    return folder


def _squad_args(ctx: Context) -> list[str]:
    """The reading slice's data: SQuAD v1.1's dev file (staged by ``scripts/gpu-wheels``, in
    ``$RELMEM_DATA/squad`` or ``~/.cache/relmem/squad``) with a fifth of its articles held out;
    else (and always with --tiny) the tests' sample, one article of three held out."""
    if not ctx.tiny:
        data = os.environ.get("RELMEM_DATA")
        roots = [REPO / ".gpu-data", *([Path(data)] if data else []), Path.home() / ".cache/relmem"]
        for root in roots:
            dev = root / "squad" / "dev-v1.1.json"
            if dev.is_file():
                return ["--task.train-file", str(dev), "--task.held-out-articles", "0.2"]
    sample = REPO / "tests" / "data" / "squad" / "sample-v1.1.json"
    folder = ctx.work / "squad-sample"  # its caches are written beside it, not in the checkout
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(sample, folder / sample.name)
    return ["--task.train-file", str(folder / sample.name), "--task.held-out-articles", "0.34"]


def _slice_command(name: str, spec: Slice) -> Callable[[Context], list[str]]:
    def command(ctx: Context) -> list[str]:
        steps = spec.tiny_steps if ctx.tiny else spec.steps
        budget = SLICE_BUDGETS.get(name, 45.0)
        argv = [ctx.python, "-m", "relmem", "train", spec.task, "--preset", spec.preset]
        argv += ["--device", ctx.device, "--steps", str(steps), "--eval-every", str(steps)]
        argv += ["--checkpoint-every", str(steps), "--log-every", str(max(1, steps // 10))]
        argv += ["--out-dir", str(ctx.work / "runs"), "--run-name", name, "--no-tensorboard"]
        # a safety net under the budget: the trainer stops, evaluates and checkpoints itself
        argv += ["--time-limit-min", f"{max(budget - 20.0, 10.0) / 60:.3f}"]
        if spec.task == "lm":
            argv += ["--task.data-dir", str(_lm_corpus(ctx))]
        if spec.task == "squad":
            argv += _squad_args(ctx)
        argv += list(spec.overrides)
        if ctx.tiny:  # 'fast', what 'auto' is on CUDA: on the CPU it builds the fused C++ step
            argv += ["--cpu-threads", "1", "--rmc.implementation", "fast", *spec.tiny_overrides]
        return argv

    return command


def _read_slice(name: str, spec: Slice) -> Callable[[Context, str], dict[str, Any]]:
    def read(ctx: Context, output: str) -> dict[str, Any]:
        run = ctx.work / "runs" / name
        summary = json.loads((run / "summary.json").read_text())
        records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
        rates = [r[f"perf/{spec.rate}"] for r in records if r.get(f"perf/{spec.rate}")]
        # the first window holds the start-up (and any compilation): left out where others exist
        steady = rates[1:] or rates
        metric = summary["metric"]
        found = {
            "status": summary["status"],
            "steps": summary["steps"],
            "target_steps": summary["target_steps"],
            "wall_time_s": summary["wall_time_s"],
            "parameters": summary["parameters"],
            spec.rate: sorted(steady)[len(steady) // 2] if steady else None,
            "metric": metric,
            f"held_out_{metric}": summary.get(f"held_out_{metric}"),
            "held_out_loss": summary.get("held_out_loss"),
        }
        if spec.task == "lm":
            corpus = _lm_corpus(ctx)
            found["corpus"] = "synthetic" if corpus.name.startswith("synthetic") else str(corpus)
        config = json.loads((run / "config.json").read_text())
        _append_json(ctx.out / "runs.json", {"part": name, "config": config, "metrics": records})
        return found

    return read


# ---------------------------------------------------------------------------------------------
# the parts, in order


def parts() -> list[Part]:
    """Every part, in the order they run (cheap and most needed first)."""
    found = [
        Part("env", 20.0, lambda ctx: [ctx.python, "-c", ENV_SNIPPET, ctx.device], _read_env),
        Part("tests", 150.0, _test_command, _read_tests),
    ]
    for config in BENCH_CONFIGS:
        found.append(
            Part(
                f"bench-{config}",
                BENCH_BUDGETS.get(config, 30.0),
                _bench_command([config], compile_only=False),
                _read_bench(config),
                # its model alone (76 M parameters) takes half a CPU minute to build and time
                skip=lambda ctx, config=config: (
                    "76 M parameters: too large for a CPU minute"
                    if ctx.tiny and config == "lm_paper"
                    else None
                ),
            )
        )
    found.append(Part("precision", 40.0, _precision_command, _read_precision))
    for name, spec in SLICES.items():
        found.append(
            Part(
                name,
                SLICE_BUDGETS.get(name, 45.0),
                _slice_command(name, spec),
                _read_slice(name, spec),
                prepare=_lm_corpus if spec.task == "lm" else None,
            )
        )
    found.append(
        Part(
            "bench-compile",
            75.0,
            _bench_command(COMPILE_CONFIGS, compile_only=True),
            _read_bench("compile"),
            # the dry run times the plumbing eager: inductor's build takes CPU minutes
            env=lambda ctx: {"TORCHDYNAMO_DISABLE": "1"} if ctx.tiny else {},
        )
    )
    return found


# ---------------------------------------------------------------------------------------------
# running


_WRITING = threading.Lock()  # parts run side by side on the dry run (--jobs)


def _append_json(path: Path, item: Any) -> None:
    """Append ``item`` to the JSON list in ``path`` (created if missing)."""
    with _WRITING:
        items = json.loads(path.read_text()) if path.exists() else []
        items.append(item)
        path.write_text(json.dumps(items, indent=1))


def _run_command(argv: list[str], env: dict[str, str], timeout: float) -> tuple[int | None, str]:
    """Run ``argv`` in the repository root in a process group of its own; on timeout send
    SIGINT (trainers checkpoint and stop), then SIGKILL to the group after a grace period.

    Returns:
        (exit status or None when it was killed for its budget, its stdout and stderr).
    """
    with tempfile.TemporaryFile("w+") as capture:
        process = subprocess.Popen(
            argv,
            cwd=REPO,
            env=env,
            stdout=capture,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            status: int | None = process.wait(timeout=max(timeout, 1.0))
        except subprocess.TimeoutExpired:
            status = None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        capture.seek(0)
        return status, capture.read()


def run_part(part: Part, ctx: Context, budget: float, log: Any) -> dict[str, Any]:
    """Run one part within ``budget`` seconds; its summary entry."""
    entry: dict[str, Any] = {"budget_s": part.budget_s, "allowed_s": round(budget, 1)}
    extra = part.env(ctx)
    if extra:
        entry["env"] = extra
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **extra}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
    start = time.monotonic()
    try:
        if part.prepare is not None:
            part.prepare(ctx)
        argv = part.command(ctx)
    except Exception as exc:  # a part's set-up failing must not stop the others
        entry |= {"status": "error", "error": f"set-up: {type(exc).__name__}: {exc}"}
        return entry
    entry["command"] = " ".join(argv[:2] + ["<snippet>"] if part.name == "env" else argv)
    status, output = _run_command(argv, env, budget - (time.monotonic() - start))
    entry["seconds"] = round(time.monotonic() - start, 1)
    entry["exit_status"] = status
    data = output.encode()
    with _WRITING:
        log.write(f"\n===== {part.name} ({entry['seconds']} s, exit {status}) =====\n")
        log.write(entry["command"] + "\n")
        if len(data) > LOG_TAIL_BYTES:
            log.write(f"[first {len(data) - LOG_TAIL_BYTES} bytes left out]\n")
        log.write(data[-LOG_TAIL_BYTES:].decode(errors="replace"))
        log.flush()
    if status is None:
        entry["status"] = "timeout"
    elif status == 0 or (part.name == "tests" and status == 1):  # 1: some tests failed
        entry["status"] = "ok" if status == 0 else "failures"
    else:
        entry["status"] = "error"
        entry["error"] = output.strip().splitlines()[-1][:300] if output.strip() else ""
    try:
        entry["results"] = part.read(ctx, output)
    except Exception as exc:  # what a killed or failed part left may be incomplete
        entry["read_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return entry


def main(argv: list[str] | None = None) -> int:
    names = [p.name for p in parts()]
    parser = argparse.ArgumentParser(prog="scripts/gpu-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder for the results ($OUT on the device)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="toy sizes: the CPU dry run")
    parser.add_argument("--only", nargs="+", choices=names, help="run these parts alone")
    parser.add_argument("--total-budget", type=float, default=TOTAL_BUDGET_S, help="seconds")
    parser.add_argument("--work", type=Path, help="scratch folder (default: a temporary one)")
    parser.add_argument(
        "--jobs",
        type=int,
        help="parts run side by side (default 1, and 3 with --tiny; more than one only with "
        "--tiny: timings taken side by side mean nothing)",
    )
    args = parser.parse_args(argv)
    args.jobs = args.jobs or (3 if args.tiny else 1)
    if args.jobs < 1 or (args.jobs > 1 and not args.tiny):
        parser.error("--jobs above 1 needs --tiny (the GPU's parts are timed one at a time)")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error("--device cuda: no CUDA device here; the dry run is --device cpu --tiny")
    args.out.mkdir(parents=True, exist_ok=True)
    for stale in ("summary.json", "log.txt", "bench.json", "runs.json"):
        (args.out / stale).unlink(missing_ok=True)
    with contextlib.ExitStack() as stack:
        work = args.work or Path(stack.enter_context(tempfile.TemporaryDirectory("gpu-check")))
        work.mkdir(parents=True, exist_ok=True)
        ctx = Context(args.out.resolve(), work.resolve(), args.device, args.tiny)
        summary: dict[str, Any] = {
            "device": args.device,
            "tiny": args.tiny,
            "total_budget_s": args.total_budget,
            "parts": {},
        }
        start = time.monotonic()
        chosen = [p for p in parts() if not args.only or p.name in args.only]

        def one(part: Part, log: Any) -> dict[str, Any]:
            left = args.total_budget - (time.monotonic() - start)
            reason = part.skip(ctx)
            if reason is None and left < 5:
                reason = f"the total budget of {args.total_budget:.0f} s is spent"
            if reason is not None:
                return {"status": "skipped", "reason": reason}
            entry = run_part(part, ctx, min(part.budget_s, left), log)
            print(f"gpu-check: {part.name}: {entry['status']} ({entry['seconds']} s)", flush=True)
            return entry

        with open(args.out / "log.txt", "w") as log:
            if args.jobs == 1:
                entries = [one(part, log) for part in chosen]
            else:  # the dry run: timings mean nothing there, the wall time does
                with ThreadPoolExecutor(args.jobs) as pool:
                    entries = list(pool.map(lambda part: one(part, log), chosen))
        summary["parts"] = {part.name: e for part, e in zip(chosen, entries, strict=True)}
        summary["seconds"] = round(time.monotonic() - start, 1)
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    bad = [n for n, e in summary["parts"].items() if e["status"] not in ("ok", "skipped")]
    print(f"gpu-check: {len(summary['parts'])} parts in {summary['seconds']} s; not ok: {bad}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
