"""``relmem answer RUN_DIR --context FILE_OR_TEXT --question "..."``: a trained reader's answer.

The run's best weights are used; ``--context`` is a text file's path, or the text itself, of
any length: it is cut into paragraphs, ranked against each question, and the ``--paragraphs``
best are read. The answer is printed with the reader's probability and score for it and where it
stands in the text (its character offsets, line, paragraph and a window of the context around
it), and with ``--top N`` the N - 1 next best. A long read shows a progress bar on stderr once
it has taken 2 seconds.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated

import tyro

from relmem.commands.errors import describe_error
from relmem.files import FileRefused, read_bytes
from relmem.tasks.reading.answer import PARAGRAPHS, Answer, check_text
from relmem.tasks.reading.ranking import Ranker, check_ranker_weight
from relmem.train.checkpoint import CheckpointError
from relmem.train.distributed import resolve_device


@dataclass
class AnswerArgs:
    """Answer questions about a text with a reader trained by ``relmem train squad``.

    Attributes:
        run_dir: the run directory, or a folder written by ``relmem export``.
        context: the text to read: a file's path, or the text itself (text with no whitespace
            that looks like a path must be a file that exists).
        question: the question (repeat the option to ask several).
        paragraphs: read the N paragraphs ranked best for each question (0: all of them).
        top: print the N best answers, each from another span.
        checkpoint: a checkpoint directory instead of the run's best.
        device: auto, cpu, cuda or mps.
        ranker: what ranks the paragraphs against each question (None: the reader's own
            ``task.ranker``; ``docs/reading.md`` §6).
        ranker_weight: how much the ranker's word weighs beside the reader's when the answer
            is chosen among paragraphs (None: the reader's own ``task.ranker_weight``; 0: the
            reader's choice alone; ``docs/reading.md`` §7).
    """

    run_dir: Annotated[Path, tyro.conf.Positional]
    context: str
    question: Annotated[list[str], tyro.conf.UseAppendAction] = field(default_factory=list)
    paragraphs: int = PARAGRAPHS
    top: int = 1
    checkpoint: Path | None = None
    device: str = "cpu"
    ranker: Ranker | None = None
    ranker_weight: float | None = None


def read_context(value: str) -> str:
    """The text ``--context`` means: the file it names, else the value itself.

    Raises:
        ValueError: the value is empty; it names something that is not a regular file (a
            folder, a device), or a file that is not UTF-8 or holds no text; it looks like a
            path (no whitespace, a ``/`` or a file suffix) and no such file exists; or the
            text holds bytes that are not UTF-8.
    """
    if not value.strip():
        raise ValueError("--context is empty: pass a text file, or the text itself")
    path = Path(value).expanduser()
    if path.exists():
        try:
            text = read_bytes(path).decode("utf-8")
        except FileRefused as exc:
            raise ValueError(f"--context {exc}; pass a text file, or the text itself") from None
        except UnicodeDecodeError as exc:
            raise ValueError(f"--context {path}: not UTF-8 text (byte {exc.start})") from None
        if not text.strip():
            raise ValueError(f"--context {path}: the file holds no text; pass a text to read")
        return text
    looks_like_path = not any(ch.isspace() for ch in value) and (
        "/" in value or "\\" in value or bool(path.suffix)
    )
    if looks_like_path:
        raise ValueError(f"--context {value}: no such file (pass a text file, or the text itself)")
    check_text("--context", value)
    return value


def check_questions(questions: list[str]) -> None:
    """Refuse no ``--question``, an empty one, or one holding bytes that are not UTF-8.

    Raises:
        ValueError: naming the option (and which one, when several are given).
    """
    if not questions:
        raise ValueError('--question is required (--question "Who ...?")')
    for number, question in enumerate(questions, 1):
        which = "--question" if len(questions) == 1 else f"--question (the {_ordinal(number)})"
        if not question.strip():
            raise ValueError(f"{which} is empty: ask a question")
        check_text(which, question)


def check_counts(paragraphs: int, top: int) -> None:
    """Refuse a negative ``--paragraphs`` or a ``--top`` below 1.

    Raises:
        ValueError: naming the option and the fix.
    """
    if paragraphs < 0:
        raise ValueError(
            f"--paragraphs {paragraphs}: read at least 1 paragraph, or pass 0 to read them all"
        )
    if top < 1:
        raise ValueError(f"--top {top}: print at least the best answer (--top 1)")


def _ordinal(number: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``11th``."""
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10)
    return f"{number}{suffix or 'th'}"


def main(argv: list[str]) -> int:
    """Entry point of ``relmem answer``; prints each question's answer."""
    try:
        args = tyro.cli(AnswerArgs, args=argv, prog="relmem answer")
    except SystemExit as exc:  # tyro has printed help or a boxed error message
        return int(exc.code or 0)
    from relmem.tasks.reading.answer import load_reader

    try:
        check_questions(args.question)
        check_counts(args.paragraphs, args.top)
        context = read_context(args.context)
        if args.ranker_weight is not None:
            check_ranker_weight(args.ranker_weight, "--ranker-weight")
        reader = load_reader(args.run_dir, args.checkpoint, str(resolve_device(args.device)))
        if args.ranker is not None:
            reader.config = replace(reader.config, ranker=args.ranker)
        if args.ranker_weight is not None:
            reader.config = replace(reader.config, ranker_weight=args.ranker_weight)
        answers = reader(
            context, args.question, progress=True, paragraphs=args.paragraphs, top=args.top
        )
    except (ValueError, TypeError, KeyError, CheckpointError, OSError) as exc:
        print(f"relmem answer: error: {describe_error(exc, '--checkpoint')}", file=sys.stderr)
        return 2
    assert isinstance(answers, list)
    for a in answers:
        print(f"Q: {a.question}")
        print(f"A: {_summary(a)}")
        if a.start >= 0:
            before = context[max(0, a.start - 60) : a.start].replace("\n", " ")
            after = context[a.end : a.end + 60].replace("\n", " ")
            print(f"   characters {a.start}-{a.end} of {len(context)}")
            print(f"   ...{before}[[{a.text}]]{after}...")
        for rank, other in enumerate(a.alternatives, 2):
            print(f"{rank:>2}. {_summary(other)}")
    return 0


def _summary(a: Answer) -> str:
    """An answer's text, probability, score and place (line, paragraph counted from 1)."""
    scores = f"probability {a.probability:.3f}  score {a.score:.2f}"
    if a.start < 0:
        return f"(no answer)  {scores}"
    return f"{a.text}  {scores}  line {a.line}, paragraph {a.paragraph + 1}"
