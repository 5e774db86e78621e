"""WikiText-2 and WikiText-103: the releases' token counts and SHA-1s, and getting the files.

The figures are those of ``docs/tasks.md`` §3.2; where to get the data is §3.6.
:func:`fetch` downloads a release through the Hugging Face ``datasets`` package (the optional
``data`` extra) into ``$RELMEM_DATA/NAME`` (default ``~/.cache/relmem/NAME``), written
as ``wiki.{train,valid,test}.tokens``; the loader then rebuilds the token streams and checks
their counts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DATA_ENV", "RELEASES", "Release", "data_root", "differences", "fetch", "recognise"]

DATA_ENV = "RELMEM_DATA"
HF_DATASET = "Salesforce/wikitext"
_HF_SPLITS = {"train": "train", "valid": "validation", "test": "test"}


@dataclass(frozen=True)
class Release:
    """One WikiText release under the word-level convention (``docs/tasks.md`` §3.2).

    Attributes:
        vocab_size: distinct tokens, ``<eos>`` and ``<unk>`` included.
        tokens: tokens per split.
        sha1: SHA-1 of each split's ``wiki.*.tokens`` file.
        hf_config: the configuration name of the Hugging Face dataset.
    """

    vocab_size: int
    tokens: dict[str, int]
    sha1: dict[str, str]
    hf_config: str


RELEASES = {
    "wikitext-2": Release(
        33_278,
        {"train": 2_088_628, "valid": 217_646, "test": 245_569},
        {
            "train": "863f29c46ef9d167fff4940ec821195882fe29d1",
            "valid": "0418625c8b4da6e4b5c7a0b9e78d4ae8f7ee5422",
            "test": "c7b8ce0aa086fb34dab808c5c49224211eb2b172",
        },
        "wikitext-2-v1",
    ),
    "wikitext-103": Release(
        267_735,
        {"train": 103_227_021, "valid": 217_646, "test": 245_569},
        {
            "train": "b7497e2dfe77e72cfef5e3dbc61b7b53712ac211",
            "valid": "c326ac59dc587676d58c422eb8a03e119582f92b",
            "test": "8a5befc548865cec54ed4273cf87dbbad60d1e47",
        },
        "wikitext-103-v1",
    ),
}


def recognise(sha1s: dict[str, str]) -> str | None:
    """The release one of whose files has one of these SHA-1s, or None."""
    for name, release in RELEASES.items():
        if set(sha1s.values()) & set(release.sha1.values()):
            return name
    return None


def differences(
    name: str, sha1s: dict[str, str], counts: dict[str, int], vocab_size: int, check_sha1: bool
) -> list[str]:
    """How split files with these SHA-1s, token counts and vocabulary differ from ``name``."""
    release = RELEASES[name]
    found = []
    for split, count in counts.items():
        if check_sha1 and sha1s[split] != release.sha1[split]:
            found.append(f"{split} SHA-1 {sha1s[split]} is not {release.sha1[split]}")
        if count != release.tokens[split]:
            found.append(f"{split} has {count:,} tokens, not {release.tokens[split]:,}")
    if vocab_size != release.vocab_size:
        found.append(f"the vocabulary has {vocab_size:,} tokens, not {release.vocab_size:,}")
    return found


def data_root() -> Path:
    """Where downloaded releases go: ``$RELMEM_DATA``, else ``~/.cache/relmem``."""
    return Path(os.environ.get(DATA_ENV) or Path.home() / ".cache" / "relmem").expanduser()


def how_to_get(name: str) -> str:
    """Instructions for getting ``name`` by hand, for error messages."""
    folder = data_root() / name
    extra = (
        " WikiText-2 is also in pytorch/examples, word_language_model/data/wikitext-2/"
        "{train,valid,test}.txt."
        if name == "wikitext-2"
        else ""
    )
    return (
        f"Get {name}-v1.zip (Salesforce Research; see docs/tasks.md §3.6, `relmem docs tasks 3.6`) "
        f"and unzip it so that {folder}/wiki.train.tokens, wiki.valid.tokens and wiki.test.tokens "
        f"exist (set {DATA_ENV} to use another folder than {folder.parent}), or pass "
        f"--data-dir DIR for a directory holding them.{extra}"
    )


def fetch(name: str) -> Path:
    """The directory holding release ``name``, downloaded first if it is not there yet.

    Raises:
        ValueError: an unknown name, or the download is impossible (``datasets`` missing, the
            machine offline); the message says how to get the files by hand and where to put
            them.
    """
    if name not in RELEASES:
        raise ValueError(f"dataset must be one of {', '.join(RELEASES)}; got {name!r}")
    folder = data_root() / name
    files = [folder / f"wiki.{split}.tokens" for split in _HF_SPLITS]
    if all(f.is_file() for f in files):
        return folder
    try:
        import datasets
    except ImportError:
        raise ValueError(
            f"{name} is not in {folder} and the `datasets` package, which would download it, "
            "is not installed (pip install -e '.[data]' in the relmem repository). "
            + how_to_get(name)
        ) from None
    try:
        loaded = datasets.load_dataset(HF_DATASET, RELEASES[name].hf_config)
    except Exception as exc:  # offline, hub errors: datasets raises many types
        raise ValueError(f"downloading {name} failed ({exc}). {how_to_get(name)}") from exc
    folder.mkdir(parents=True, exist_ok=True)
    for hf_split, path in zip(_HF_SPLITS.values(), files, strict=True):
        # A row is a line of the original file, with or without its newline (blank lines are
        # empty rows); the token stream is the same either way (docs/tasks.md §3.6).
        lines = (row.rstrip("\n") + "\n" for row in loaded[hf_split]["text"])
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(lines)
        os.replace(tmp, path)
    return folder
