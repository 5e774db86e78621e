"""``relmem bench``: FLOP accounting and one tiny end-to-end run writing its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relmem.benchmarking.configs import CONFIGS, FLOOR
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


def tiny_run(out: Path, steps: int, *extra: str) -> list[str]:
    """A one-repeat CPU run of the ``small`` configuration at ``steps`` × 2, writing to ``out``."""
    sizes = ["--steps", str(steps), "--batch", "2", "--warmup", "0", "--repeat", "1"]
    return ["--device", "cpu", "--configs", "small", *sizes, *extra, "--out", str(out)]


def test_bench_writes_json_with_every_implementation(tmp_path: Path) -> None:
    assert main(tiny_run(tmp_path, 3)) == 0
    (path,) = tmp_path.glob("bench-cpu-*.json")
    payload = json.loads(path.read_text())
    assert payload["machine"]["torch_threads"] >= 1 and payload["machine"]["cpu"]
    records = {r["implementation"]: r for r in payload["results"]}
    assert set(records) == {"reference", "fast", "lstm-params", "lstm-width", FLOOR}
    for record in records.values():
        assert record["config"] == "small" and (record["steps"], record["batch"]) == (3, 2)
        for kind in ("forward", "train"):
            assert record[kind]["median_ms"] > 0 and len(record[kind]["times_ms"]) == 1
    assert records["fast"]["train"]["saved_activation_bytes"] > 0
    assert records[FLOOR]["products"]["loop"][0] == {"rows": 4, "inputs": 128, "outputs": 384}
    assert "÷ matmul-floor" in payload["table"]


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
    assert args.configs == tuple(CONFIGS) and args.only is None and not args.compile
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


@pytest.mark.parametrize("argv", [["--repeat", "x"], ["--configs", "huge"], ["--bogus"]])
def test_bench_rejects_malformed_options(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
