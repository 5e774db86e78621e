"""Answering questions about any text with a trained reader (``relmem answer``, or in Python
:func:`answer` / :func:`load_reader`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from relmem.tasks.reading.task import Reading, best_spans

__all__ = ["Answer", "AnswerReader", "answer", "load_reader"]


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
        task: the run's :class:`Reading` task (its vocabulary). model: its reader.
    """

    def __init__(self, task: Reading, model: torch.nn.Module) -> None:
        self.task, self.model = task, model.eval()

    @torch.no_grad()
    def __call__(self, context: str, questions: str | list[str]) -> Answer | list[Answer]:
        """The best span of ``context`` for each question (a list for a list).

        Raises:
            ValueError: the context or a question is empty.
        """
        asked = [questions] if isinstance(questions, str) else list(questions)
        device = next(self.model.parameters()).device
        batch = self.task.ask(context, asked).to(device)
        logits, _ = self.model(batch.inputs, None, lengths=batch.lengths)
        logits = logits.float()
        first, last, _ = best_spans(logits, self.task.config.max_answer_tokens)
        log_start = torch.log_softmax(logits[..., 0], dim=1)  # [B, 1 + T]
        log_end = torch.log_softmax(logits[..., 1], dim=1)
        answers = []
        for row, question in enumerate(asked):
            i, j = int(first[row]), int(last[row])
            logp = log_start[row, i + 1] + log_end[row, j + 1]
            if i < 0:
                answers.append(Answer(question, "", -1, -1, float(logp.exp())))
                continue
            encoded = self.task._encoded(int(batch.targets[row, 3]))
            text, start, end = encoded.answer_text(row, i, j)
            answers.append(Answer(question, text, start, end, float(logp.exp())))
        return answers[0] if isinstance(questions, str) else answers


def load_reader(
    run_dir: Path | str, checkpoint: Path | None = None, device: str = "cpu"
) -> AnswerReader:
    """The reader of a ``relmem train squad`` run (its best weights unless ``checkpoint``).

    Raises:
        ValueError: the run is not a reading run, or its data differs from what it trained on.
        CheckpointError: no intact checkpoint.
    """
    from relmem.train.runs import load_trained

    _, task_name, task, model, _ = load_trained(
        Path(run_dir), checkpoint, torch.device(device), prefer_best=True
    )
    if not isinstance(task, Reading):
        raise ValueError(f"{run_dir} is a run of {task_name!r}, not a reader (relmem train squad)")
    return AnswerReader(task, model)


def answer(run_dir: Path | str, context: str, question: str, device: str = "cpu") -> Answer:
    """One call: the answer a trained reader (a run directory) gives to ``question`` about
    ``context``. Loading the run dominates: keep :func:`load_reader`'s reader for many."""
    result = load_reader(run_dir, device=device)(context, question)
    assert isinstance(result, Answer)
    return result
