"""Reading comprehension: extractive question answering on SQuAD-layout files
(``relmem train squad``, ``relmem answer``; ``docs/reading.md``)."""

from relmem.tasks.reading import presets
from relmem.tasks.reading.answer import Answer, AnswerReader, answer, load_reader
from relmem.tasks.reading.metric import normalize_answer, score_predictions, squad_scores
from relmem.tasks.reading.squad import SquadError, read_squad
from relmem.tasks.reading.task import Reading, ReadingConfig, best_spans

__all__ = [
    "Answer",
    "AnswerReader",
    "answer",
    "load_reader",
    "Reading",
    "ReadingConfig",
    "SquadError",
    "best_spans",
    "normalize_answer",
    "presets",
    "read_squad",
    "score_predictions",
    "squad_scores",
]
