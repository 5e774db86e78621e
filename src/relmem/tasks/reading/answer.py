"""Answering questions about any text with a trained reader (``relmem answer``, or in Python
:func:`answer` / :func:`load_reader`)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor
from tqdm import tqdm

from relmem.tasks.base import row_chunks
from relmem.tasks.reading.data import EncodedSplit, Vocabulary, tokenized
from relmem.tasks.reading.squad import Question, SquadFile, lone_surrogate
from relmem.tasks.reading.task import Reading, ReadingConfig, best_spans

__all__ = ["Answer", "AnswerReader", "answer", "load_reader"]

# the progress bar of a long read: shown after this many seconds, redrawn this often
PROGRESS_AFTER_S = 2.0
PROGRESS_EVERY_S = 1.0
# questions per forward pass (fewer where their rows pass row_chunks' token budget: each row
# holds the whole context)
CHUNK_ROWS = 64


@dataclass(frozen=True)
class Answer:
    """A reader's answer to one question.

    Attributes:
        question: the question asked.
        text: the answer, exactly as it stands in the context ("" for "no answer").
        start, end: its character offsets (``context[start:end] == text``; -1 -1 for none).
        probability: the reader's probability of this span (its start's softmax times its
            end's, over every position of the context and "no answer").
    """

    question: str
    text: str
    start: int
    end: int
    probability: float


class AnswerReader:
    """A trained reader ready to answer: ``reader(context, question) -> Answer``.

    Args:
        vocabulary: the words and characters it was trained with (what its ids mean).
        config: its task's configuration (the character width, question block and longest
            answer).
        model: the reader.
    """

    def __init__(
        self, vocabulary: Vocabulary, config: ReadingConfig, model: torch.nn.Module
    ) -> None:
        self.vocabulary, self.config, self.model = vocabulary, config, model.eval()

    @torch.no_grad()
    def __call__(
        self, context: str, questions: str | list[str], progress: bool = False
    ) -> Answer | list[Answer]:
        """The best span of ``context`` for each question (a list for a list), the questions
        read a chunk of rows at a time.

        Args:
            progress: show a progress bar on stderr once answering has taken
                :data:`PROGRESS_AFTER_S` seconds (a long context takes minutes).

        Raises:
            ValueError: the context or a question is empty, or holds a lone surrogate (not
                Unicode text: bytes that were not UTF-8).
        """
        asked = [questions] if isinstance(questions, str) else list(questions)
        if not context.strip():
            raise ValueError("the context is empty")
        if not asked:
            raise ValueError("no question asked")
        check_text("the context", context)
        for number, question in enumerate(asked, 1):
            if not question.strip():
                raise ValueError(f"question {number} is empty")
            check_text(f"question {number}", question)
        rows = [Question(str(i), q, 0, (), ()) for i, q in enumerate(asked)]
        squad = SquadFile(Path("<asked>"), [context], [""], rows)
        encoded = EncodedSplit(tokenized(squad), self.vocabulary, self.config.chars)
        index = torch.arange(len(asked))
        lengths = encoded.context_tokens + self.config.question_tokens
        device = next(self.model.parameters()).device
        answers = []
        tokens = int(encoded.context_tokens[0])
        bar = tqdm(
            total=len(asked),
            desc=f"reading {tokens:,} tokens",
            unit="question",
            delay=PROGRESS_AFTER_S,
            disable=not progress,
            leave=False,
        )
        with bar, ticking(bar, PROGRESS_AFTER_S, PROGRESS_EVERY_S):
            for part in row_chunks(index, lengths, CHUNK_ROWS):
                inputs, part_lengths, _ = encoded.rows(part, self.config.question_tokens, None)
                logits, _ = self.model(inputs.to(device), None, lengths=part_lengths.to(device))
                answers += self._answers(encoded, part, logits.float(), asked)
                bar.update(len(part))
        return answers[0] if isinstance(questions, str) else answers

    def _answers(
        self, encoded: EncodedSplit, part: Tensor, logits: Tensor, asked: list[str]
    ) -> list[Answer]:
        """The answers of questions ``part [B]`` from their ``logits [B, 1 + T, 2]``."""
        first, last, _ = best_spans(logits, self.config.max_answer_tokens)
        log_start = torch.log_softmax(logits[..., 0], dim=1)  # [B, 1 + T]
        log_end = torch.log_softmax(logits[..., 1], dim=1)
        answers = []
        for row, question in enumerate(part.tolist()):
            i, j = int(first[row]), int(last[row])
            probability = float((log_start[row, i + 1] + log_end[row, j + 1]).exp())
            if i < 0:
                answers.append(Answer(asked[question], "", -1, -1, probability))
                continue
            text, start, end = encoded.answer_text(question, i, j)
            answers.append(Answer(asked[question], text, start, end, probability))
        return answers


def check_text(what: str, text: str) -> None:
    """Refuse ``text`` (``what`` names it) when it holds a lone surrogate.

    Raises:
        ValueError: naming where, and that the bytes it came from were not UTF-8.
    """
    at = lone_surrogate(text)
    if at is not None:
        raise ValueError(
            f"{what} holds {ascii(text[at])} at character {at}, which is not Unicode text (a "
            "byte that is not UTF-8, or half of a surrogate pair): pass UTF-8 text"
        )


@contextmanager
def ticking(bar: tqdm, after: float, every: float) -> Iterator[None]:
    """Redraw ``bar`` every ``every`` seconds once ``after`` seconds have passed, while the
    block runs: its elapsed time then moves during one long forward pass, which updates
    nothing."""
    stop = threading.Event()

    def tick() -> None:
        if stop.wait(after):
            return
        while not stop.is_set():
            bar.refresh()
            stop.wait(every)

    thread = threading.Thread(target=tick, daemon=True)
    if not bar.disable:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()


def load_reader(
    run_dir: Path | str, checkpoint: Path | None = None, device: str = "cpu"
) -> AnswerReader:
    """The reader of a ``relmem train squad`` run (its best weights unless ``checkpoint``),
    or of a folder written by ``relmem export`` (its weights and ``vocab.json``: the
    training file is not needed).

    Raises:
        ValueError: the run is not a reading run, or its data differs from what it trained on.
        CheckpointError: no intact checkpoint.
    """
    from relmem.pretrained import load_pretrained
    from relmem.train.exported import is_exported
    from relmem.train.runs import load_trained

    path = Path(run_dir)
    if is_exported(path) and checkpoint is None:
        model, words, task_name, config = load_pretrained(path, device=device)
        if not isinstance(config.task, ReadingConfig) or not isinstance(words, dict):
            raise ValueError(f"{path} holds a model of {task_name!r}, not a reader")
        return AnswerReader(Vocabulary.from_exported(words), config.task, model)
    _, task_name, task, model, _ = load_trained(
        path, checkpoint, torch.device(device), prefer_best=True
    )
    if not isinstance(task, Reading):
        raise ValueError(f"{path} is a run of {task_name!r}, not a reader (relmem train squad)")
    return AnswerReader(task.vocabulary, task.config, model)


def answer(run_dir: Path | str, context: str, question: str, device: str = "cpu") -> Answer:
    """One call: the answer a trained reader (a run directory) gives to ``question`` about
    ``context``. Loading the run dominates: keep :func:`load_reader`'s reader for many."""
    result = load_reader(run_dir, device=device)(context, question)
    assert isinstance(result, Answer)
    return result
