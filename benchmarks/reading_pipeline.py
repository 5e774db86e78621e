"""Time the reading task's data pipeline on a file the size of SQuAD's train set.

SQuAD's train file is not reachable from the machines this library is developed on, so the
official dev file (10,570 questions) is repeated ``--copies`` times (8: 84,560 questions,
16,536 paragraphs, close to train's 87,599 and 18,896) with its ids made unique, into a
temporary folder. Timed: reading and checking the JSON, tokenising (first without a cache,
then from it), building the vocabulary, and encoding the tensors; printed as JSON.

    PYTHONPATH=src python benchmarks/reading_pipeline.py --dev-file dev-v1.1.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

from relmem.tasks.reading.data import EncodedSplit, load_vocabulary, read_tokenized


def enlarged(dev: Path, copies: int, folder: Path) -> Path:
    """``dev`` repeated ``copies`` times, each copy's ids and titles suffixed."""
    document = json.loads(dev.read_text(encoding="utf-8"))
    data = []
    for copy in range(copies):
        for article in document["data"]:
            paragraphs = [
                {
                    "context": p["context"],
                    "qas": [{**qa, "id": f"{qa['id']}-{copy}"} for qa in p["qas"]],
                }
                for p in article["paragraphs"]
            ]
            data.append({"title": f"{article['title']} {copy}", "paragraphs": paragraphs})
    path = folder / "train-sized.json"
    path.write_text(json.dumps({"version": "1.1", "data": data}), encoding="utf-8")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dev-file", type=Path, required=True)
    parser.add_argument("--copies", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        path = enlarged(args.dev_file, args.copies, Path(tmp))
        times = {}
        start = time.perf_counter()
        text = read_tokenized(path)
        times["read_check_tokenize_s"] = time.perf_counter() - start
        start = time.perf_counter()
        text = read_tokenized(path)
        times["read_check_cached_tokens_s"] = time.perf_counter() - start
        start = time.perf_counter()
        vocabulary = load_vocabulary(text, 1, 5)
        times["vocabulary_s"] = time.perf_counter() - start
        start = time.perf_counter()
        encoded = EncodedSplit(text, vocabulary, 16)
        times["encode_s"] = time.perf_counter() - start
    print(
        json.dumps(
            {
                "questions": len(encoded),
                "paragraphs": len(text.squad.contexts),
                "context_tokens": int(encoded.starts[-1]),
                "words": vocabulary.size,
                **{k: round(v, 2) for k, v in times.items()},
                "machine": platform.processor() or platform.machine(),
                "loadavg": os.getloadavg(),
                "torch": torch.__version__,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
