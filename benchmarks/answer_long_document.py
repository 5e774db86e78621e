"""Seconds per question of ``relmem answer`` on a long text, on one core, after loading.

The text is a SQuAD-layout file's contexts joined by blank lines, cut at the paragraph that
passes ``--chars`` characters (written to ``--text``); the questions are the file's first
``--questions`` answerable ones. Each question is asked alone, as ``relmem answer`` does:
cutting and ranking the paragraphs, then reading the best ``--paragraphs``. Prints one JSON
object: the load average, each question's seconds, their median and maximum, and how often the
answer came from the question's own paragraph.

    python benchmarks/answer_long_document.py --reader RUN_DIR --file dev-v1.1.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from relmem.tasks.reading import load_reader
from relmem.tasks.reading.ranking import split_paragraphs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reader", type=Path, required=True, help="a run or exported reader")
    parser.add_argument("--file", type=Path, required=True, help="a SQuAD-layout JSON file")
    parser.add_argument("--chars", type=int, default=100_000)
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--paragraphs", type=int, default=4)
    parser.add_argument("--text", type=Path, default=Path("/tmp/relmem-long-document.txt"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    document = json.loads(args.file.read_text(encoding="utf-8"))
    contexts, asked = [], []
    for article in document["data"]:
        for paragraph in article["paragraphs"]:
            if sum(map(len, contexts)) + 2 * len(contexts) >= args.chars:
                break
            contexts.append(paragraph["context"])
            asked += [
                (qa["question"], len(contexts) - 1)
                for qa in paragraph["qas"]
                if not qa.get("is_impossible")
            ]
    text = "\n\n".join(contexts)
    args.text.write_text(text, encoding="utf-8")
    reader = load_reader(args.reader)
    parts = split_paragraphs(text)
    seconds, own = [], 0
    for question, paragraph in asked[: args.questions]:
        began = time.perf_counter()
        result = reader(text, question, paragraphs=args.paragraphs)
        seconds.append(time.perf_counter() - began)
        assert not isinstance(result, list)
        own += result.start >= 0 and parts[result.paragraph].text == contexts[paragraph]
    print(json.dumps({
        "text": str(args.text), "characters": len(text), "paragraphs": len(parts),
        "questions": len(seconds), "read_per_question": args.paragraphs,
        "median_s": statistics.median(seconds), "max_s": max(seconds),
        "seconds": [round(s, 3) for s in seconds], "answered_from_own_paragraph": own,
        "load_average": os.getloadavg(), "threads": torch.get_num_threads(),
        "machine": platform.platform(), "processor": platform.processor(),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
