"""From a SQuAD-layout file to tensors: the vocabulary, the encoded split and its batches.

- :class:`Vocabulary`: lower-cased words and characters of the *training* file (ids 0 pad,
  1 unknown), so a run's ids never depend on the file it is evaluated on. Its identity (sizes
  and a SHA-1 of its entries) is what ``data.json`` records.
- :class:`EncodedSplit`: a file's paragraphs and questions as flat int32 tensors (every token's
  word id, characters, case-sensitive and lower-cased type ids for the exact-match features,
  and character offsets) with each question's gold token span.
- :meth:`EncodedSplit.rows` packs questions into the reader's input layout (below), each
  with its own paragraph or with a list of paragraphs read joined as one context (an
  article's, ``--task.document article``).

Tokenisation is cached beside the data, keyed on the file's SHA-1 (content, not size and
time), as safetensors (no pickle): ``DIR/.relmem-cache/NAME.SHA1.tokens.safetensors``.

Input layout of one row, ``inputs [B, Q + T, 3 + C]`` int32 (``docs/reading.md`` §3): steps
``0..Q-1`` are the question (right-padded), steps ``Q..`` the context; column 0 the word id,
columns 1-2 the exact-match features (the token occurs in the other text, as written and
lower-cased), columns ``3..3 + C - 1`` the first ``C`` characters' ids, and, for a reader that
weighs the ranker's order (``--task.rank-prior``), column ``3 + C`` the rank of the paragraph
each context token stands in. ``lengths [B]`` is ``Q`` plus the context's tokens, so trimming a
batch to its longest row keeps every question.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from relmem.files import file_digest
from relmem.tasks.reading.squad import SquadFile, align, read_squad, tokenize

__all__ = [
    "PAD",
    "UNK",
    "EncodedSplit",
    "SplitStats",
    "TokenizedFile",
    "Vocabulary",
    "load_vocabulary",
    "read_tokenized",
    "tokenized",
]

PAD, UNK = 0, 1
TOKENIZER = "tokenizers.BertPreTokenizer"
CACHE_DIR = ".relmem-cache"
CACHE_VERSION = 1


@dataclass(frozen=True)
class Tokenized:
    """A file's token offsets: ``context_spans [Nc, 2]`` and ``question_spans [Nq, 2]`` int32
    (start, end) character offsets, and where each text's tokens begin: ``context_starts
    [P + 1]``, ``question_starts [Q + 1]`` int64."""

    context_spans: Tensor
    context_starts: Tensor
    question_spans: Tensor
    question_starts: Tensor

    @staticmethod
    def of(squad: SquadFile) -> Tokenized:
        def flat(texts: list[str]) -> tuple[Tensor, Tensor]:
            spans = [tokenize(text) for text in texts]
            counts = torch.tensor([0] + [len(s) for s in spans], dtype=torch.int64)
            joined = [pair for s in spans for pair in s]
            table = torch.tensor(joined, dtype=torch.int32).reshape(-1, 2)
            return table, counts.cumsum(0)

        contexts = flat(squad.contexts)
        questions = flat([q.text for q in squad.questions])
        return Tokenized(*contexts, *questions)


def _cached_tokens(squad: SquadFile, sha1: str) -> Tokenized:
    """The file's tokenisation from its cache, or made and cached (when the folder allows)."""
    cache = squad.path.parent / CACHE_DIR / f"{squad.path.name}.{sha1}.tokens.safetensors"
    expected = {"tokenizer": TOKENIZER, "version": str(CACHE_VERSION), "sha1": sha1}
    if cache.exists():
        try:
            tensors = load_file(cache)
            with open(cache, "rb") as handle:  # the header's metadata, without the tensors
                size = int.from_bytes(handle.read(8), "little")
                metadata = json.loads(handle.read(size)).get("__metadata__", {})
            if metadata == expected:
                return Tokenized(**tensors)
        except (SafetensorError, OSError, ValueError, TypeError, KeyError):
            pass  # a damaged or foreign cache is made again
    tokens = Tokenized.of(squad)
    write_cache(
        cache,
        lambda tmp: save_file(dict(tokens.__dict__), tmp, metadata=expected),
        f"the tokens of {squad.path}",
    )
    return tokens


def write_cache(cache: Path, write: Callable[[Path], object], what: str | None) -> None:
    """Write a cache file atomically: ``write(tmp)`` into a temporary file beside ``cache``
    (its folder made if missing), then renamed over it. A folder that cannot be written leaves
    no file behind and the data uncached; ``what`` (None: say nothing) is named on stderr.
    The temporary files of writers that were killed are removed first
    (:func:`remove_orphaned_temporaries`)."""
    tmp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
    try:
        cache.parent.mkdir(exist_ok=True)
        remove_orphaned_temporaries(cache.parent)
        write(tmp)
        os.replace(tmp, cache)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if what is not None:
            print(f"relmem: not caching {what} ({exc.strerror})", file=sys.stderr)


def remove_orphaned_temporaries(folder: Path) -> None:
    """Remove the temporary files (``.NAME.PID.tmp``) in the cache folder ``folder`` whose
    writing process no longer runs: what a writer killed mid-write left (up to tens of MB
    each). A file whose process id is in use again stays until that process ends. Nothing is
    removed where a process cannot be looked up by id (not POSIX)."""
    if os.name != "posix":
        return
    for tmp in folder.glob(".*.tmp"):
        pid = tmp.name[: -len(".tmp")].rpartition(".")[2]
        if pid.isdigit() and not _process_runs(int(pid)):
            tmp.unlink(missing_ok=True)


def _process_runs(pid: int) -> bool:
    """Whether process ``pid`` exists (signal 0 checks without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's (PermissionError), or cannot tell: keep its file
        return True
    return True


def _texts(text: str, spans: Tensor) -> list[str]:
    return [text[s:e] for s, e in spans.tolist()]


@dataclass(frozen=True)
class Vocabulary:
    """Lower-cased words and characters, ids from 2 (0 pad, 1 unknown), most frequent first.

    Attributes:
        words: the word of each id from 2.
        chars: the character of each id from 2.
    """

    words: tuple[str, ...]
    chars: tuple[str, ...]

    @staticmethod
    def build(texts: list[str], min_word_count: int, min_char_count: int) -> Vocabulary:
        """Every lower-cased token of ``texts`` seen ``min_word_count`` times (characters:
        ``min_char_count``), ties in first-seen order."""
        words = Counter(text.lower() for text in texts)
        chars = Counter(ch for text in texts for ch in text)
        return Vocabulary(
            tuple(w for w, n in words.most_common() if n >= min_word_count),
            tuple(c for c, n in chars.most_common() if n >= min_char_count),
        )

    @property
    def size(self) -> int:
        """Word ids, pad and unknown included."""
        return len(self.words) + 2

    @property
    def char_size(self) -> int:
        """Character ids, pad and unknown included."""
        return len(self.chars) + 2

    def identity(self) -> dict[str, Any]:
        """Sizes and SHA-1 of the entries: what the weights' ids mean."""
        digest = hashlib.sha1("\n".join(self.words).encode())
        digest.update(b"\0" + "\n".join(self.chars).encode())
        return {
            "tokenizer": TOKENIZER,
            "lowercase": True,
            "words": self.size,
            "chars": self.char_size,
            "sha1": digest.hexdigest(),
        }

    def exported(self) -> dict[str, list[str]]:
        """Words and characters in id order, ids 0 and 1 (padding, unknown) included: what
        ``relmem export`` writes as ``vocab.json``."""
        special = ["<pad>", "<unk>"]
        return {"words": [*special, *self.words], "chars": [*special, *self.chars]}

    @staticmethod
    def from_exported(record: dict[str, list[str]]) -> Vocabulary:
        """The vocabulary whose :meth:`exported` record is ``record``."""
        return Vocabulary(tuple(record["words"][2:]), tuple(record["chars"][2:]))

    def word_ids(self, tokens: list[str]) -> Tensor:
        """``[N]`` int32 ids of ``tokens`` (lower-cased)."""
        index = self._word_index
        return torch.tensor([index.get(t.lower(), UNK) for t in tokens], dtype=torch.int32)

    def char_ids(self, tokens: list[str], width: int) -> Tensor:
        """``[N, width]`` int32 ids of each token's first ``width`` characters (0 after)."""
        index, pad = self._char_index, [PAD] * width
        distinct: dict[str, int] = {}
        positions = [distinct.setdefault(token, len(distinct)) for token in tokens]
        rows = [([index.get(ch, UNK) for ch in token[:width]] + pad)[:width] for token in distinct]
        table = torch.tensor(rows, dtype=torch.int32).reshape(len(distinct), width)
        return table[torch.tensor(positions, dtype=torch.int64)]

    @property
    def _word_index(self) -> dict[str, int]:
        cached = self.__dict__.get("_words_cache")
        if cached is None:
            cached = {w: i + 2 for i, w in enumerate(self.words)}
            object.__setattr__(self, "_words_cache", cached)
        return cached

    @property
    def _char_index(self) -> dict[str, int]:
        cached = self.__dict__.get("_chars_cache")
        if cached is None:
            cached = {c: i + 2 for i, c in enumerate(self.chars)}
            object.__setattr__(self, "_chars_cache", cached)
        return cached


@dataclass(frozen=True)
class SplitStats:
    """What encoding a split counted: ``answers`` reference answers, ``unaligned`` of them
    matching no token, ``inexact`` whose token span's text differs from the reference (a
    reference starting or ending inside a token), ``truncated_questions`` longer than the
    question block."""

    answers: int
    unaligned: int
    inexact: int
    truncated_questions: int


def _type_ids(tokens: list[str], table: dict[str, int]) -> Tensor:
    return torch.tensor([table.setdefault(t, len(table)) for t in tokens], dtype=torch.int32)


class EncodedSplit:
    """A SQuAD-layout file as tensors, ready to be packed into rows.

    Attributes:
        squad: the file as read.
        sha1: the file's SHA-1.
        words, chars, cased, lowered, spans: per context token (``[Nc]``, ``[Nc, C]``,
            ``[Nc]``, ``[Nc]``, ``[Nc, 2]`` int32); ``starts [P + 1]`` bounds each paragraph,
            ``sizes`` (a list of P) counts its tokens.
        q_words, q_chars, q_cased, q_lowered, q_starts: the same for the questions.
        gold: ``[Q, 2]`` int64 the first reference's token span (-1 -1: none, unanswerable or
            not aligned).
        context_tokens: ``[Q]`` int64 each question's context length in tokens.
        stats: the alignment's counts.
    """

    def __init__(self, text: TokenizedFile, vocabulary: Vocabulary, chars: int) -> None:
        squad, tokens = text.squad, text.tokens
        self.squad, self.sha1 = squad, text.sha1
        context_text, question_text = text.context_text, text.question_text
        cased: dict[str, int] = {}
        lowered: dict[str, int] = {}
        self.spans, self.starts = tokens.context_spans, tokens.context_starts
        self.q_starts = tokens.question_starts
        self.words = vocabulary.word_ids(context_text)
        self.chars = vocabulary.char_ids(context_text, chars)
        self.cased = _type_ids(context_text, cased)
        self.lowered = _type_ids([t.lower() for t in context_text], lowered)
        self.q_words = vocabulary.word_ids(question_text)
        self.q_chars = vocabulary.char_ids(question_text, chars)
        self.q_cased = _type_ids(question_text, cased)
        self.q_lowered = _type_ids([t.lower() for t in question_text], lowered)
        gold, unaligned, inexact, answers = [], 0, 0, 0
        every_span, bounds = tokens.context_spans.tolist(), self.starts.tolist()
        paragraph_spans = [every_span[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
        for q in squad.questions:
            spans = paragraph_spans[q.paragraph]
            first = None
            for text, start in zip(q.answers, q.answer_starts, strict=True):
                answers += 1
                span = align(spans, start, start + len(text))
                if span is None:
                    unaligned += 1
                    continue
                context = squad.contexts[q.paragraph]
                if context[spans[span[0]][0] : spans[span[1]][1]] != text:
                    inexact += 1
                first = first or span
            gold.append(first or (-1, -1))
        self.gold = torch.tensor(gold, dtype=torch.int64).reshape(-1, 2)
        sizes = self.starts.diff()
        self.sizes: list[int] = sizes.tolist()
        self.context_tokens = sizes[[q.paragraph for q in squad.questions]]
        self.question_tokens = self.q_starts.diff()
        self._counts = (answers, unaligned, inexact)

    def __len__(self) -> int:
        return len(self.squad.questions)

    def stats(self, question_block: int) -> SplitStats:
        """The alignment's counts, and the questions longer than ``question_block`` tokens."""
        truncated = int((self.question_tokens > question_block).sum())
        return SplitStats(*self._counts, truncated)

    def rows(
        self,
        index: Tensor,
        question_block: int,
        max_context: int | None,
        contexts: Sequence[Sequence[int]] | None = None,
        gap: int = 0,
        ranks: Sequence[Sequence[int]] | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Questions ``index [B]`` packed in the reader's layout (module docstring).

        Args:
            question_block: Q, question tokens kept (longer questions are cut).
            max_context: context steps kept (None: all); a gold span beyond is dropped.
            contexts: each row's paragraphs (indices into ``squad.contexts``), read joined in
                this order as one context (None: each question's own paragraph). The gold
                span is offset by the steps before the question's own paragraph, and is -1 -1
                where its own paragraph is not among them.
            gap: padding steps between two paragraphs of a row (0: joined end to end; 1: the
                windows a reader with ``ReaderOptions.windows`` reads each on its own).
            ranks: each row's paragraphs' ranks (from 1, the best ranked), as ``contexts``
                (None: no rank column). Given, every row gets one more column, ``3 + C``, that
                holds each context token's paragraph's rank (0 on the question and padding):
                what a reader with ``ReaderOptions.paragraph_ranks`` reads.

        Returns:
            ``(inputs [B, Q + T, 3 + C (+ 1)] int32, lengths [B] int64, gold [B, 2] int64)``,
            T the longest kept context.
        """
        questions = self.squad.questions
        picked = index.tolist()
        read = [[questions[i].paragraph] for i in picked] if contexts is None else contexts
        lengths = self.joined_tokens(read, gap)
        if max_context is not None:
            lengths = lengths.clamp(max=max_context)
        steps = question_block + int(lengths.max())
        width = 3 + self.chars.shape[1]
        columns_out = width + (ranks is not None)
        inputs = torch.zeros(len(picked), steps, columns_out, dtype=torch.int32)
        for row, (i, paragraphs) in enumerate(zip(picked, read, strict=True)):
            q0, q1 = int(self.q_starts[i]), int(self.q_starts[i + 1])
            q1 = min(q1, q0 + question_block)
            owners, columns = self._placement(paragraphs, gap)
            kept = columns < lengths[row]
            tokens = self._tokens(paragraphs)[kept]  # [T_row] into the flat arrays
            q_cased, c_cased = self.q_cased[q0:q1], self.cased[tokens]
            q_lowered, c_lowered = self.q_lowered[q0:q1], self.lowered[tokens]
            question = inputs[row, : q1 - q0]
            question[:, 0] = self.q_words[q0:q1]
            question[:, 1] = torch.isin(q_cased, c_cased)
            question[:, 2] = torch.isin(q_lowered, c_lowered)
            question[:, 3:width] = self.q_chars[q0:q1]
            where = question_block + columns[kept]  # gaps stay padding
            inputs[row, where, 0] = self.words[tokens]
            inputs[row, where, 1] = torch.isin(c_cased, q_cased).int()
            inputs[row, where, 2] = torch.isin(c_lowered, q_lowered).int()
            inputs[row, where, 3:width] = self.chars[tokens]
            if ranks is not None:
                if len(ranks[row]) != len(paragraphs):
                    raise ValueError(
                        f"row {row}: {len(ranks[row])} ranks for {len(paragraphs)} paragraphs"
                    )
                paragraph_ranks = torch.tensor(ranks[row], dtype=torch.int32)
                inputs[row, where, width] = paragraph_ranks[owners[kept]]
        return inputs, lengths + question_block, self.row_gold(index, read, lengths, gap)

    def row_gold(
        self,
        index: Tensor,
        contexts: Sequence[Sequence[int]],
        kept: Tensor | None = None,
        gap: int = 0,
    ) -> Tensor:
        """``[B, 2]`` int64: the gold span of each question ``index [B]`` in its row, whose
        context is ``contexts``' paragraphs joined ``gap`` steps apart (:meth:`rows`): offset
        by the steps before its own paragraph; -1 -1 where it has none, its own paragraph is
        not read, or the span ends past the row's ``kept [B]`` steps (None: all kept)."""
        gold = torch.full((len(index), 2), -1, dtype=torch.int64)
        for row, (i, paragraphs) in enumerate(zip(index.tolist(), contexts, strict=True)):
            own = self.squad.questions[i].paragraph
            if own not in paragraphs or self.gold[i, 0] < 0:
                continue
            before = paragraphs[: list(paragraphs).index(own)]
            span = self.gold[i] + sum(self.sizes[p] + gap for p in before)
            if kept is None or span[1] < kept[row]:
                gold[row] = span
        return gold

    def joined_tokens(self, contexts: Sequence[Sequence[int]], gap: int = 0) -> Tensor:
        """``[len(contexts)]`` int64: the steps of each list of paragraphs read joined, ``gap``
        padding steps between two paragraphs."""
        sizes = self.sizes
        return torch.tensor(
            [sum(sizes[p] for p in c) + gap * max(len(c) - 1, 0) for c in contexts],
            dtype=torch.int64,
        )

    def segments(self, paragraphs: Sequence[int], gap: int = 0) -> Tensor:
        """``[T]`` int64: for each step of ``paragraphs`` joined ``gap`` steps apart, the
        position in ``paragraphs`` of the paragraph it belongs to (-1 on a gap)."""
        segments = torch.full((int(self.joined_tokens([paragraphs], gap)),), -1)
        owners, columns = self._placement(paragraphs, gap)
        segments[columns] = owners
        return segments

    def _tokens(self, paragraphs: Sequence[int]) -> Tensor:
        """``[T]`` int64: the flat token indices of ``paragraphs`` joined in order."""
        starts = self.starts
        return torch.cat([torch.arange(int(starts[p]), int(starts[p + 1])) for p in paragraphs])

    def _placement(self, paragraphs: Sequence[int], gap: int) -> tuple[Tensor, Tensor]:
        """For each token of :meth:`_tokens`: its paragraph's position in ``paragraphs`` and
        its step in the row's context, ``gap`` steps left between two paragraphs (``[T]``
        int64 each)."""
        sizes = torch.tensor([self.sizes[p] for p in paragraphs], dtype=torch.int64)
        owners = torch.repeat_interleave(torch.arange(len(paragraphs)), sizes)
        return owners, torch.arange(int(sizes.sum())) + gap * owners

    def answer_text(
        self,
        question: int,
        first: int,
        last: int,
        paragraphs: Sequence[int] | None = None,
        gap: int = 0,
    ) -> tuple[str, int, int]:
        """The text of context steps ``first..last`` of ``question``'s row, with its
        character offsets ``(text, start, end)`` in the paragraph that holds it: the row's
        context is its own paragraph, or ``paragraphs`` joined in order ``gap`` steps apart
        (:meth:`rows`' ``contexts``).

        Raises:
            ValueError: the span starts on a gap, runs past the end of the paragraph it starts
                in, or lies beyond the context (the span search,
                :func:`~relmem.tasks.reading.task.best_spans` with the rows' segments, proposes
                none of these).
        """
        read = [self.squad.questions[question].paragraph] if paragraphs is None else paragraphs
        offset = 0
        for p in read:
            size = self.sizes[p]
            if first < offset:
                raise ValueError(f"step {first} lies on the gap before paragraph {p}")
            if first < offset + size:
                break
            offset += size + gap
        else:
            raise ValueError(f"token {first} lies beyond the context's {offset - gap} steps")
        if last >= offset + size:
            raise ValueError(
                f"tokens {first}..{last} run past the end of paragraph {p} (token {offset + size})"
            )
        c0 = int(self.starts[p]) - offset
        start = int(self.spans[c0 + first, 0])
        end = int(self.spans[c0 + last, 1])
        return self.squad.contexts[p][start:end], start, end


def _part(tokens: Tokenized, i: int, context: bool) -> Tensor:
    spans, starts = (
        (tokens.context_spans, tokens.context_starts)
        if context
        else (tokens.question_spans, tokens.question_starts)
    )
    return spans[int(starts[i]) : int(starts[i + 1])]


@dataclass(frozen=True)
class TokenizedFile:
    """A checked file, its SHA-1, its tokens' offsets and their texts (``context_text``: every
    paragraph's tokens in order; ``question_text``: every question's)."""

    squad: SquadFile
    sha1: str
    tokens: Tokenized
    context_text: list[str]
    question_text: list[str]


def read_tokenized(path: Path) -> TokenizedFile:
    """Read and check ``path`` (:func:`read_squad`) and tokenise it (cached by its SHA-1)."""
    squad = read_squad(path)
    sha1 = file_digest(path, "sha1")
    return tokenized(squad, sha1, _cached_tokens(squad, sha1))


def tokenized(squad: SquadFile, sha1: str = "", tokens: Tokenized | None = None) -> TokenizedFile:
    """``squad`` with its tokens (made here when ``tokens`` is None, uncached: a file in
    memory, such as ``relmem answer``'s question)."""
    tokens = Tokenized.of(squad) if tokens is None else tokens
    contexts = [_texts(c, _part(tokens, i, True)) for i, c in enumerate(squad.contexts)]
    questions = [_texts(q.text, _part(tokens, i, False)) for i, q in enumerate(squad.questions)]
    return TokenizedFile(
        squad, sha1, tokens, [t for c in contexts for t in c], [t for q in questions for t in q]
    )


def load_vocabulary(train: TokenizedFile, min_word_count: int, min_char_count: int) -> Vocabulary:
    """The vocabulary of the training file ``train``, cached beside it as JSON."""
    name = f"{train.squad.path.name}.{train.sha1}.vocab-{min_word_count}-{min_char_count}.json"
    cache = train.squad.path.parent / CACHE_DIR / name
    try:
        stored = json.loads(cache.read_text(encoding="utf-8"))
        if stored.get("tokenizer") == TOKENIZER and stored.get("version") == CACHE_VERSION:
            return Vocabulary(tuple(stored["words"]), tuple(stored["chars"]))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        pass  # missing or damaged: made again
    vocabulary = Vocabulary.build(
        train.context_text + train.question_text, min_word_count, min_char_count
    )
    record = {"tokenizer": TOKENIZER, "version": CACHE_VERSION}
    record |= {"words": list(vocabulary.words), "chars": list(vocabulary.chars)}
    write_cache(
        cache,
        lambda tmp: tmp.write_text(json.dumps(record, ensure_ascii=False), encoding="utf-8"),
        f"the vocabulary of {train.squad.path}",
    )
    return vocabulary
