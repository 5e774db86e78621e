"""A small corpus in the WikiText layout, written for the tests (not taken from WikiText)."""

from __future__ import annotations

from pathlib import Path

TRAIN = """ 
 = Harbour Lights = 
 
 The Harbour Lights are a row of three lamps on the north pier of a small fishing town . 
 They were lit for the first time in 1871 , and a keeper looked after them until 1958 . 
 
 = = History = = 
 
 The lamps replaced a single beacon that ships could not see in fog . The town paid 
 for them with a tax on every barrel of fish landed at the pier . 
 In 1958 the lamps were fitted with electric bulbs , and the keeper 's cottage became a 
 small museum about the <unk> trade . 
 
 = = Design = = 
 
 Each lamp stands 4 @.@ 5 metres tall on a cast iron column . The three columns are 
 painted white , and the lamps show a green light that can be seen 12 @,@ 000 metres away . 
 
"""

VALID = """ 
 = Mill Pond = 
 
 The Mill Pond is a small lake behind the old mill . It was dug in 1790 to drive the 
 wheel , and the town still uses it for skating when it freezes . 
 
"""

TEST = """ 
 = Old Bridge = 
 
 The Old Bridge crosses the river a short walk from the pier . Its three stone arches 
 were built in 1820 , and a fourth was added when the road was widened . 
 
"""

SPLITS = {"train": TRAIN, "valid": VALID, "test": TEST}


def write_sample(folder: Path, layout: str = "wikitext") -> Path:
    """Write the sample as ``wiki.*.tokens`` (``'wikitext'``) or ``*.txt`` (``'txt'``)."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, text in SPLITS.items():
        name = f"wiki.{split}.tokens" if layout == "wikitext" else f"{split}.txt"
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def expected_tokens(text: str) -> list[str]:
    """The convention of docs/tasks.md §3.2 written out plainly: every line's words, then
    <eos>, blank lines included."""
    return [w for line in text.splitlines() for w in [*line.split(), "<eos>"]]
