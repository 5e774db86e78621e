"""Where a reading run's files come from, and the article-disjoint split of one file.

``--task.train-file`` / ``--task.dev-file`` name files; ``--data-dir DIR`` finds SQuAD's own
names in a folder; ``--dataset squad | squad_v2`` downloads SQuAD with Hugging Face
``datasets`` into ``$RELMEM_DATA/NAME`` (written in SQuAD's JSON layout) when it is not there.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from relmem.files import FileRefused, open_regular
from relmem.tasks.language_model.wikitext import DATA_ENV, data_root
from relmem.tasks.reading.data import TokenizedFile
from relmem.tasks.reading.squad import SquadFile

__all__ = ["held_out_articles", "resolve", "without_articles"]

# a data folder's file names, by version: (train, dev)
NAMES = {"v1.1": ("train-v1.1.json", "dev-v1.1.json"), "v2.0": ("train-v2.0.json", "dev-v2.0.json")}
HF_NAMES = {"squad": ("rajpurkar/squad", "v1.1"), "squad_v2": ("rajpurkar/squad_v2", "v2.0")}
URL = "https://rajpurkar.github.io/SQuAD-explorer/"


def how_to_get(folder: Path) -> str:
    """Instructions for getting SQuAD by hand, for error messages."""
    return (
        f"Download train-v1.1.json and dev-v1.1.json (or the v2.0 files) from {URL} into "
        f"{folder} and pass --data-dir {folder}, or name files with --task.train-file and "
        f"--task.dev-file (docs/reading.md §2, `relmem docs reading 2`)"
    )


def resolve(config: Any) -> tuple[Path, Path | None]:
    """The training file and the evaluation file (None: hold out articles of the training
    file) that ``config`` (a :class:`~relmem.tasks.reading.task.ReadingConfig`) names.

    Raises:
        ValueError: nothing names the data, a named file or folder is missing, a file is
            not a regular file (a folder, a device), or the download is impossible (the
            message says how to get the files).
    """
    train, dev = config.train_file, config.dev_file
    if (train is None or dev is None) and config.data_dir is not None:
        folder = config.data_dir
        if not folder.is_dir():
            kind = "a file, not a folder" if folder.exists() else "missing"
            raise ValueError(f"--data-dir {folder} is {kind}. {how_to_get(folder)}")
        # a folder or a device by a train file's name is refused below, not passed over
        found = [(folder / t, folder / d) for t, d in NAMES.values() if _present(folder / t)]
        if not found and train is None:
            raise ValueError(
                f"--data-dir {folder} holds no train-v1.1.json or train-v2.0.json. "
                + how_to_get(folder)
            )
        if found:
            train = train or found[0][0]
            dev = dev or (found[0][1] if _present(found[0][1]) else None)
    if train is None and config.dataset is not None:
        train, dev = download(config.dataset)
    if train is None:
        raise ValueError(
            "no data given: pass --data-dir DIR (with train-v1.1.json and dev-v1.1.json), "
            "--task.train-file FILE [--task.dev-file FILE], or --dataset squad | squad_v2"
        )
    for path, option, named in ((train, "--task.train-file", config.train_file),
                                (dev, "--task.dev-file", config.dev_file)):  # fmt: skip
        if path is not None:
            _check_file(path, option if path == named else _origin(config))
    if dev is None and config.held_out_articles is None:
        raise ValueError(
            f"no evaluation file: pass --task.dev-file FILE, or --task.held-out-articles 0.2 "
            f"to evaluate on a share of {train.name}'s articles that training never sees"
        )
    return train, dev


def _present(path: Path) -> bool:
    """Whether something (a file, a folder, a link) stands at ``path``."""
    return path.exists() or path.is_symlink()


def _origin(config: Any) -> str:
    """The option that found a file ``config`` did not name itself."""
    return f"--data-dir {config.data_dir}:" if config.data_dir is not None else "--dataset:"


def _check_file(path: Path, option: str) -> None:
    """Refuse ``path``, given by ``option``, unless it is a regular file that can be opened.

    Raises:
        ValueError: naming the option, the file, what it is and what to pass instead.
    """
    try:
        os.close(open_regular(path))
    except FileRefused as exc:
        raise ValueError(
            f"{option} {exc}; pass a SQuAD-layout JSON file (docs/reading.md §2, "
            "`relmem docs reading 2`)"
        ) from None


def download(name: str) -> tuple[Path, Path]:
    """SQuAD (``'squad'``) or SQuAD 2.0 (``'squad_v2'``) in ``$RELMEM_DATA/NAME``, downloaded
    with Hugging Face ``datasets`` and written in the JSON layout if not there yet.

    Raises:
        ValueError: ``datasets`` is missing or the download failed (offline): how to get the
            files by hand.
    """
    hub_name, version = HF_NAMES[name]
    folder = data_root() / name
    files = tuple(folder / n for n in NAMES[version])
    if all(f.is_file() for f in files):
        return files
    try:
        import datasets
    except ImportError:
        raise ValueError(
            f"{name} is not in {folder} and the `datasets` package, which would download it, "
            f"is not installed (pip install -e '.[data]'). {how_to_get(folder)}; {DATA_ENV} "
            "sets where downloads go"
        ) from None
    try:
        loaded = datasets.load_dataset(hub_name)
    except Exception as exc:  # offline, hub errors: datasets raises many types
        raise ValueError(f"downloading {name} failed ({exc}). {how_to_get(folder)}") from exc
    folder.mkdir(parents=True, exist_ok=True)
    for split, path in zip(("train", "validation"), files, strict=True):
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(_as_squad(loaded[split], version)), encoding="utf-8")
        os.replace(tmp, path)
    return files


def _as_squad(rows: Any, version: str) -> dict[str, Any]:
    """Hugging Face's flat rows (id, title, context, question, answers) in SQuAD's layout."""
    articles: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        paragraphs = articles.setdefault(row["title"], {})
        paragraph = paragraphs.setdefault(row["context"], {"context": row["context"], "qas": []})
        answers = [
            {"text": t, "answer_start": s}
            for t, s in zip(row["answers"]["text"], row["answers"]["answer_start"], strict=True)
        ]
        qa = {"id": row["id"], "question": row["question"], "answers": answers}
        if version == "v2.0":
            qa["is_impossible"] = not answers
        paragraph["qas"].append(qa)
    data = [
        {"title": title, "paragraphs": list(paragraphs.values())}
        for title, paragraphs in articles.items()
    ]
    return {"version": version, "data": data}


def held_out_articles(squad: SquadFile, share: float, seed: int) -> set[str]:
    """``round(share · articles)`` (at least 1, at most all but 1) article titles of
    ``squad``, drawn by ``seed``; each untitled article has a title of its own
    (:func:`~relmem.tasks.reading.squad.read_squad`).

    Raises:
        ValueError: ``squad`` has fewer than 2 articles.
    """
    titles = squad.articles()
    if len(titles) < 2:
        raise ValueError(
            f"{squad.path}: --task.held-out-articles needs at least 2 articles (paragraphs "
            f"under one title are one article), it has {len(titles)}; pass --task.dev-file"
        )
    count = min(max(1, round(share * len(titles))), len(titles) - 1)
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(titles), generator=generator).tolist()
    return {titles[i] for i in order[:count]}


def without_articles(text: TokenizedFile, articles: set[str]) -> TokenizedFile:
    """``text`` with the tokens of ``articles``' paragraphs and questions left out (what a
    vocabulary may be built from); ``text`` itself when ``articles`` is empty."""
    if not articles:
        return text
    squad, tokens = text.squad, text.tokens
    keep = [t not in articles for t in squad.titles]
    starts, q_starts = tokens.context_starts.tolist(), tokens.question_starts.tolist()
    contexts = [
        token
        for p, kept in enumerate(keep)
        if kept
        for token in text.context_text[starts[p] : starts[p + 1]]
    ]
    questions = [
        token
        for i, q in enumerate(squad.questions)
        if keep[q.paragraph]
        for token in text.question_text[q_starts[i] : q_starts[i + 1]]
    ]
    digest = hashlib.sha1("\n".join(sorted(articles)).encode()).hexdigest()[:12]
    suffix = f"-without-{digest}"
    return replace(text, sha1=text.sha1 + suffix, context_text=contexts, question_text=questions)
