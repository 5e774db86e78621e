"""``relmem bench``: FLOP accounting and one tiny end-to-end run writing its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relmem.bench import CONFIGS, FLOOR, fast_path_products, main, step_flops
from relmem.cores.rmc import RMCConfig

VARIANTS = {
    "three-blocks": {"num_blocks": 3},
    "three-blocks-query-memory": {"num_blocks": 3, "query_rows": "memory"},
    "no-gate": {"gate_style": None},
    "memory-gate-matrix-input": {"gate_style": "memory", "input_rows": 3},
}


def _attention_flops(config: RMCConfig) -> int:
    """Attention's two products in the fast loop, per block: 2·H·R_q·(N+n)·(K+D)."""
    n_slots, n_in, blocks = config.mem_slots, config.num_input_rows, config.num_blocks
    total = 0
    for index in range(blocks):
        updates_inputs = config.query_rows == "all" and index < blocks - 1
        query_rows = n_slots + n_in if updates_inputs else n_slots
        total += (2 * config.num_heads * query_rows * (n_slots + n_in)
                  * (config.resolved_key_size + config.head_size))
    return total


@pytest.mark.parametrize(
    "overrides",
    [CONFIGS[name].rmc for name in CONFIGS]
    + [{**CONFIGS["small"].rmc, **extra} for extra in VARIANTS.values()],
    ids=list(CONFIGS) + list(VARIANTS),
)
def test_matmul_floor_products_agree_with_the_flop_count(overrides: dict) -> None:
    """The floor's products plus attention are exactly step_flops' fast-path count."""
    config = RMCConfig(**overrides)
    products = fast_path_products(config)
    flops = {k: sum(2 * p.rows * p.inputs * p.outputs for p in v) for k, v in products.items()}
    expected = step_flops(config)
    assert flops["hoisted"] == expected["fast_hoisted"]
    assert flops["loop"] + _attention_flops(config) == expected["fast_loop"]


def test_bench_writes_json_with_every_implementation(tmp_path: Path) -> None:
    argv = ["--device", "cpu", "--configs", "small", "--steps", "3", "--batch", "2",
            "--warmup", "0", "--repeat", "1", "--out", str(tmp_path)]
    assert main(argv) == 0
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
    argv = ["--device", "cpu", "--configs", "small", "--steps", "2", "--batch", "2",
            "--warmup", "0", "--repeat", "1", "--only", "fast", "--out", str(tmp_path)]
    assert main(argv) == 0
    (path,) = tmp_path.glob("bench-cpu-*.json")
    assert [r["implementation"] for r in json.loads(path.read_text())["results"]] == ["fast"]


def test_bench_rejects_an_unknown_implementation(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--only", "fastest"])
    assert "invalid choice: 'fastest'" in capsys.readouterr().err
