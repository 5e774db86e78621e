"""``relmem bench``: FLOP accounting and one tiny end-to-end run writing its JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from relmem.benchmarking.baselines import floor_products
from relmem.benchmarking.configs import CONFIGS, FLOOR, PORT, PYTORCH_DNC
from relmem.benchmarking.dnc import DNC_CONFIGS, pytorch_dnc_available
from relmem.benchmarking.dnc import floor_products as dnc_floor_products
from relmem.benchmarking.port import PortCore, file_sha256, load_port_class, port_arguments
from relmem.commands.bench import main, parse
from relmem.cores.rmc import RMCConfig, fast_path_products, step_flops

# Counted by hand (2·rows·in·out per product, per example and step; see the comments).
SMALL = CONFIGS["small"].rmc  # N=4, n=1, F=32, M=128, Q=384, H(K+D)=256, 2 MLP layers, W=256
TINY = {"input_size": 5, "mem_slots": 2, "head_size": 4, "num_heads": 2, "num_blocks": 3}
# TINY: M=8, Q=24, H(K+D)=16, 2 MLP layers, W=16, N+n=3 rows. Its reference: projection 80,
# three blocks of (qkv 1,152 + attention 288 + MLP 768) on all 3 rows, gates 256 + 512.
EXPECTED_FLOPS = {
    # reference: projection 8,192 + block (qkv 491,520 + attention 12,800 + MLP 327,680) +
    # gates 65,536 + 262,144; loop: qkv 393,216 + attention 10,240 + MLP 262,144 + gate 262,144;
    # hoisted: projection 8,192 + input qkv 98,304 + input gate 65,536.
    "small": (SMALL, 1_167_872, 927_744, 172_032),
    # loop: block 1 (qkv on N rows, queries and MLP on all 3) 768 + 288 + 768, block 2
    # 1,152 + 288 + 768, block 3 (queries and MLP on N rows) 1,152 + 192 + 512, gate 512.
    # hoisted: projection 80 + block 1's input qkv 384 + input gate 256.
    "three-blocks": (TINY, 80 + 3 * (1152 + 288 + 768) + 256 + 512, 6400, 720),
    # loop: every block has qkv 768, attention 192 and MLP 512 on the N rows; gate 512.
    # hoisted: projection 80 + every block's input qkv 3 x 384 + input gate 256.
    "three-blocks-query-memory": (
        {**TINY, "query_rows": "memory"},
        80 + 3 * (1152 + 288 + 768) + 256 + 512,
        4928,
        1488,
    ),
}


@pytest.mark.parametrize("case", list(EXPECTED_FLOPS))
def test_step_flops_match_a_hand_count(case: str) -> None:
    overrides, reference, loop, hoisted = EXPECTED_FLOPS[case]
    flops = step_flops(RMCConfig(**overrides))
    assert flops == {"reference": reference, "fast_loop": loop, "fast_hoisted": hoisted}


def test_matmul_floor_times_the_loop_and_hoisted_weight_products() -> None:
    products = fast_path_products(RMCConfig(**SMALL))
    assert [tuple(p) for p in products["loop"]] == [
        (4, 128, 384),
        (4, 128, 128),
        (4, 128, 128),
        (4, 128, 256),
    ]
    assert [tuple(p) for p in products["hoisted"]] == [(1, 32, 128), (1, 128, 384), (1, 128, 256)]
    # E13: the input row's qkv from the 32 inputs; the projection stays for the gate term
    folded = fast_path_products(RMCConfig(**SMALL), folded=True)
    assert folded["loop"] == products["loop"]
    assert [tuple(p) for p in folded["hoisted"]] == [(1, 32, 128), (1, 32, 384), (1, 128, 256)]
    cpu = floor_products(RMCConfig(**SMALL), 50, 32, torch.device("cpu"))
    assert cpu == folded  # the bench's small shape folds on the CPU


def tiny_run(out: Path, steps: int, *extra: str) -> list[str]:
    """A one-repeat CPU run of the ``small`` configuration at ``steps`` × 2, writing to ``out``."""
    sizes = ["--steps", str(steps), "--batch", "2", "--warmup", "0", "--repeat", "1"]
    return ["--device", "cpu", "--configs", "small", *sizes, *extra, "--out", str(out)]


def test_bench_writes_json_with_every_implementation(tmp_path: Path) -> None:
    assert main(tiny_run(tmp_path, 3)) == 0
    (path,) = tmp_path.glob("bench-cpu-*.json")
    payload = json.loads(path.read_text())
    assert payload["machine"]["torch_threads"] >= 1 and payload["machine"]["cpu"]
    expected = "kept" if sys.platform.startswith("linux") else "default"
    assert payload["machine"]["freed_memory"].startswith(expected)
    records = {r["implementation"]: r for r in payload["results"]}
    assert set(records) == {"reference", "fast", "fused", "lstm-params", "lstm-width", FLOOR}
    for record in records.values():
        assert record["config"] == "small" and (record["steps"], record["batch"]) == (3, 2)
        for kind in ("forward", "train"):
            assert record[kind]["median_ms"] > 0 and len(record[kind]["times_ms"]) == 1
    assert records["fast"]["train"]["saved_activation_bytes"] > 0
    assert records["fused"]["equivalences"] == records["fast"]["equivalences"]
    assert records[FLOOR]["products"]["loop"][0] == {"rows": 4, "inputs": 128, "outputs": 384}
    assert "÷ matmul-floor" in payload["table"]


def test_bench_without_a_compiler_skips_fused_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_build() -> None:
        raise RuntimeError("implementation='fused' ... could not build it (c++: not found)")

    monkeypatch.setattr("relmem.benchmarking.runner.load_fused_ops", no_build)
    assert main(tiny_run(tmp_path, 2)) == 0
    (path,) = tmp_path.glob("bench-cpu-*.json")
    records = {r["implementation"] for r in json.loads(path.read_text())["results"]}
    assert records == {"reference", "fast", "lstm-params", "lstm-width", FLOOR}
    assert "skipping 'fused'" in capsys.readouterr().err


def test_bench_only_times_the_named_implementations(tmp_path: Path) -> None:
    assert main(tiny_run(tmp_path, 2, "--only", "fast")) == 0
    (path,) = tmp_path.glob("bench-cpu-*.json")
    assert [r["implementation"] for r in json.loads(path.read_text())["results"]] == ["fast"]


def test_bench_rejects_an_unknown_implementation(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--only", "fastest"])
    assert exit_info.value.code == 2
    err = " ".join(capsys.readouterr().err.split())  # tyro draws its message in a box
    assert "invalid choice 'fastest' for argument '--only'" in err


def test_bench_parses_the_documented_commands(tmp_path: Path) -> None:
    args = parse(["--device", "cpu", "--threads", "1", "--repeat", "7"])
    assert (args.device, args.threads, args.repeat, args.warmup) == ("cpu", 1, 7, 1)
    assert args.core == "rmc" and args.configs is None  # all of the core's
    assert args.only is None and not args.compile
    argv = [
        "--configs",
        "small",
        "--only",
        "reference",
        "fast",
        "lstm-params",
        "matmul-floor",
        "--out",
        str(tmp_path),
        "--compile",
        "--steps",
        "3",
        "--batch",
        "2",
        "--warmup",
        "0",
    ]
    args = parse(argv)
    assert args.configs == ("small",) and args.out == tmp_path and args.compile
    assert args.only == ("reference", "fast", "lstm-params", FLOOR)
    assert (args.steps, args.batch, args.warmup) == (3, 2, 0)
    assert parse(["--list"]).list_configs


def test_bench_lists_its_configurations(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--list"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == list(CONFIGS)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--repeat", "0"], "--repeat must be >= 1, got 0"),
        (["--warmup", "-1"], "--warmup must be >= 0, got -1"),
        (["--batch", "0"], "--batch must be >= 1, got 0"),
    ],
)
def test_bench_rejects_values_out_of_range(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in " ".join(capsys.readouterr().err.split())


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The one line ``relmem bench`` printed on stderr (asserted to be one)."""
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("relmem bench: error: "), lines
    return lines[0]


@pytest.fixture
def no_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make timing a configuration fail the test: a bad option must be refused before."""
    monkeypatch.setattr(
        "relmem.commands.bench.run_config", lambda *_, **__: pytest.fail("timed anyway")
    )


@pytest.mark.parametrize(
    "device,message",
    [
        ("nosuch", "--device must be cpu, cuda or cuda:N, got 'nosuch'"),
        ("meta", "--device must be cpu, cuda or cuda:N, got 'meta'"),
        (f"cuda:{torch.cuda.device_count()}", "CUDA device(s); use --device cpu"),
    ],
)
def test_bench_refuses_a_device_it_cannot_time_on(
    tmp_path: Path, device: str, message: str, no_timing: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*tiny_run(tmp_path / "out", 2), "--device", device]) == 2
    assert message in one_error_line(capsys)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["file", "file/sub"])
def test_bench_refuses_an_out_that_is_no_directory_before_timing(
    tmp_path: Path, name: str, no_timing: None, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("not a directory\n")
    out = tmp_path / name
    assert main(tiny_run(out, 2)) == 2
    line = one_error_line(capsys)
    assert f"--out {out}" in line and "give a directory" in line


def test_bench_refuses_an_out_it_cannot_write_in_before_timing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    no_timing: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def read_only(**_: object) -> None:  # what a read-only directory does (root writes anyway)
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("relmem.benchmarking.report.tempfile.TemporaryFile", read_only)
    assert main(tiny_run(tmp_path, 2)) == 2
    assert f"--out {tmp_path}: Permission denied" in one_error_line(capsys)


@pytest.mark.parametrize("argv", [["--repeat", "x"], ["--configs", "huge"], ["--bogus"]])
def test_bench_rejects_malformed_options(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2


# A stand-in for the public port's file (its constructor, initial_state and forward signature,
# and the in-place scaling of a torch.split output that current autograd refuses); not its code.
PORT_STAND_IN = """
import torch
from torch import nn


class RelationalMemory(nn.Module):
    def __init__(self, mem_slots, head_size, input_size, num_heads=1, num_blocks=1,
                 forget_bias=1., input_bias=0., gate_style='unit', attention_mlp_layers=2,
                 key_size=None, return_all_outputs=False):
        super().__init__()
        self.mem_slots, self.mem_size = mem_slots, head_size * num_heads
        self.projector = nn.Linear(input_size, self.mem_size)

    def initial_state(self, batch_size, trainable=False):
        return torch.zeros(batch_size, self.mem_slots, self.mem_size)

    def forward(self, inputs, memory):
        outputs = []
        for step in range(inputs.shape[1]):
            head, tail = torch.split(self.projector(inputs[:, step]), [1, self.mem_size - 1], -1)
            head *= 0.5
            memory = memory + torch.cat([head, tail], -1).unsqueeze(1)
            outputs.append(memory.view(memory.shape[0], -1))
        return torch.cat(outputs), memory
"""


@pytest.fixture
def port_file(tmp_path: Path) -> Path:
    path = tmp_path / "relational_rnn_general.py"
    path.write_text(PORT_STAND_IN)
    return path


def test_bench_times_the_port_beside_the_rest(tmp_path: Path, port_file: Path) -> None:
    out = tmp_path / "results"
    assert main(tiny_run(out, 2, "--against-port", str(port_file))) == 0
    (path,) = out.glob("bench-cpu-*.json")
    payload = json.loads(path.read_text())
    records = {r["implementation"]: r for r in payload["results"]}
    assert set(records) == {"reference", "fast", "fused", "lstm-params", "lstm-width", FLOOR, PORT}
    port = records[PORT]
    assert port["train"]["median_ms"] > 0 and port["forward"]["median_ms"] > 0
    assert port["parameters"] == 32 * 128 + 128  # the stand-in's one projection, F=32 -> M=128
    assert "equivalences" not in port
    assert payload["port"] == {"path": str(port_file), "sha256": file_sha256(port_file)}
    assert "÷ port" in payload["table"]
    assert port_file.read_text() == PORT_STAND_IN  # the user's file is run as it is


def test_the_port_loader_lets_its_split_views_be_scaled_in_place(port_file: Path) -> None:
    with pytest.raises(RuntimeError, match="inplace"):  # the stand-in as current torch runs it
        namespace: dict = {}
        exec(compile(PORT_STAND_IN, "stand-in", "exec"), namespace)
        core = namespace["RelationalMemory"](2, 3, 4)
        core(torch.randn(2, 3, 4), core.initial_state(2))
    core = PortCore(load_port_class(port_file)(2, 3, 4, return_all_outputs=True))
    outputs, (memory,) = core(torch.randn(3, 2, 4))  # [T, B, F], time-major
    (outputs.sum() + memory.sum()).backward()
    assert outputs.shape == (3 * 2, 2 * 3) and memory.shape == (2, 2, 3)


def test_port_arguments_skip_options_the_port_lacks(port_file: Path) -> None:
    port = load_port_class(port_file)
    assert port_arguments(port, {"input_size": 4, "mem_slots": 2, "head_size": 3}) == {
        "input_size": 4,
        "mem_slots": 2,
        "head_size": 3,
        "return_all_outputs": True,
    }
    assert port_arguments(port, {"input_size": 4, "mem_slots": 2, "input_rows": 2}) is None


@pytest.mark.parametrize(
    "text,message",
    [
        (None, "no such file"),
        ("raise ImportError('old torch')", "failed to import: ImportError('old torch')"),
        ("x = 1", "defines no nn.Module named RelationalMemory"),
        (
            "from torch import nn\n"
            "class RelationalMemory(nn.Module):\n"
            "    def __init__(self, a): pass",
            "lacks the port's arguments",
        ),
    ],
)
def test_bench_rejects_an_unusable_port_file(
    tmp_path: Path, text: str | None, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "port.py"
    if text is not None:
        path.write_text(text)
    assert main(tiny_run(tmp_path, 2, "--against-port", str(path))) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_bench_refuses_a_port_file_that_is_not_python(
    tmp_path: Path, no_timing: None, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "relational_rnn_general.txt"
    path.write_text(PORT_STAND_IN)
    assert main(tiny_run(tmp_path, 2, "--against-port", str(path))) == 2
    line = one_error_line(capsys)
    assert f"--against-port: {path} is not a Python (.py) file" in line
    assert "relational_rnn_general.py" in line


def test_precision_script_writes_its_records(tmp_path: Path) -> None:
    """``benchmarks/rmc_precision.py`` on one case and seed: every run's errors against float64
    are finite, float32 within 1e-5 and bf16 within 0.2 on the default case, and the JSON
    holds the machine."""
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "precision.json"
    subprocess.run(
        [sys.executable, str(root / "benchmarks" / "rmc_precision.py"), "--cases", "default"]
        + ["--seeds", "0", "--json", str(out)],
        check=True,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(root / "src")},
    )
    written = json.loads(out.read_text())
    runs = {r["run"]: r for r in written["records"]}
    assert set(runs) == {"ref-f32", "fast-f32", "fused-f32", "ref-bf16", "fast-bf16"}
    errors = ("output", "final memory", "input grad", "initial memory grad", "worst param grad")
    for name, record in runs.items():
        bound = 0.2 if name.endswith("bf16") else 1e-5
        assert all(0 <= record[e] < bound for e in errors), record
    assert "cpu" in written["machine"]


@pytest.mark.parametrize(
    ("only", "need"),
    [
        ("port", "--against-port PATH"),
        ("fast+compile", "--compile"),
        ("fast+graph", "--device cuda"),
    ],
)
def test_bench_refuses_an_implementation_it_would_leave_out(
    only: str, need: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--only port`` without ``--against-port`` wrote a result file with no results."""
    argv = ["--device", "cpu", "--configs", "small", "--only", only, "--out", str(tmp_path)]
    assert main(argv) == 2
    assert one_error_line(capsys) == f"relmem bench: error: --only {only} needs {need}"
    assert list(tmp_path.iterdir()) == []


def test_plot_bench_writes_several_plots_into_an_out_directory(tmp_path: Path) -> None:
    """With several JSON files ``--out`` was ignored and each PNG written beside its JSON (in
    the repository, for the committed results)."""
    root = Path(__file__).resolve().parents[1]
    sources = sorted((root / "benchmarks" / "results").glob("bench-cpu-*.json"))[:2]
    assert len(sources) == 2
    script = [sys.executable, str(root / "benchmarks" / "plot_bench.py"), *map(str, sources)]
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "MPLBACKEND": "Agg"}
    subprocess.run([*script, "--out", str(tmp_path / "plots")], check=True, env=env)
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        s.with_suffix(".png").name for s in sources
    ]
    refused = subprocess.run([*script, "--out", str(tmp_path / "one.png")], env=env)
    assert refused.returncode == 2


def test_dnc_floor_counts_the_step_products_by_hand() -> None:
    """repeat-copy: controller 64 over input 6 + R·W 64, interface 4·16 + 3·16 + 4·5 + 3 = 135
    (docs/dnc.md §3.1), output over 64 + 64; content, link and read products per example."""
    products = dnc_floor_products(DNC_CONFIGS["repeat-copy"], 16)
    assert [tuple(p) for p in products["loop"]] == [
        (0, 16, 70, 256),
        (0, 16, 64, 256),
        (0, 16, 64, 135),
        (16, 1, 16, 16),
        (16, 4, 16, 16),
        (16, 4, 16, 16),
        (16, 4, 16, 16),
        (16, 4, 16, 16),
        (0, 16, 128, 64),
    ]
    assert products["hoisted"] == []
    layer = dnc_floor_products(DNC_CONFIGS["reader-cpu"], 32)
    assert [tuple(p) for p in layer["hoisted"]] == [(0, 1, 96, 96), (0, 1, 64, 96), (0, 1, 96, 96)]
    assert tuple(layer["loop"][0]) == (0, 32, 96 + 64, 3 * 96)  # the GRU's input gates


def test_bench_times_the_dnc(tmp_path: Path) -> None:
    argv = ["--core", "dnc", "--device", "cpu", "--configs", "repeat-copy", "reader-cpu"]
    sizes = ["--steps", "3", "--batch", "2", "--warmup", "0", "--repeat", "1"]
    assert main([*argv, *sizes, "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("bench-cpu-*.json")
    payload = json.loads(path.read_text())
    records = [(r["config"], r["implementation"]) for r in payload["results"]]
    expected = {"reference", "fused", "lstm-params", FLOOR} | (
        {PYTORCH_DNC} if pytorch_dnc_available() else set()
    )
    for config in ("repeat-copy", "reader-cpu"):
        assert {impl for c, impl in records if c == config} == expected
    by_impl = {r["implementation"]: r for r in payload["results"] if r["config"] == "reader-cpu"}
    assert by_impl["reference"]["module"] == "layer"
    assert by_impl["fused"]["parameters"] == by_impl["reference"]["parameters"]
    assert by_impl["fused"]["train"]["saved_activation_bytes"] > 0
    assert "÷ matmul-floor" in payload["table"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--core", "dnc", "--configs", "small"], "--configs small is not one of the DNC's"),
        (["--configs", "copy"], "--configs copy is not one of the RMC's"),
        (["--core", "dnc", "--only", "fast"], "--only fast is not timed with --core dnc"),
    ],
)
def test_bench_refuses_the_other_cores_names(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--device", "cpu", "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.glob("*.json"))


def test_gru_sequence_script_times_both_implementations() -> None:
    """``benchmarks/gru_sequence.py`` on short sequences: every shape has both implementations'
    train and infer medians, positive, and the speed-ups are their ratios."""
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "gru_sequence.py"), "--steps", "3"]
        + ["--repeat", "1"],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root / "src")},
    )
    written = json.loads(done.stdout)
    assert set(written["results"]) == {
        "reader-cpu-encoder",
        "reader-cpu-end-head",
        "reader-cpu-controller-backward",
        "reader-paper-encoder",
    }
    for result in written["results"].values():
        median = result["median_ms"]
        assert set(median) == {"nn.GRU train", "nn.GRU infer", "fused train", "fused infer"}
        assert all(v > 0 for v in median.values())
        assert result["speedup_train"] == median["nn.GRU train"] / median["fused train"]
