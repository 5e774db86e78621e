"""Learning to Execute (``docs/tasks.md`` §2): the program generator, its vocabulary and
curricula, the trainer's task and its presets.

:func:`generate` is the generator's public face: ``generate(task, length, nesting, n, seed)``
returns ``n`` ``(code, target)`` string pairs.
"""

from relmem.tasks.learn_to_execute import presets
from relmem.tasks.learn_to_execute.curriculum import Curriculum
from relmem.tasks.learn_to_execute.programs import TASK_NAMES, generate, sequence_lengths
from relmem.tasks.learn_to_execute.task import LearnToExecute, LearnToExecuteConfig
from relmem.tasks.learn_to_execute.vocabulary import SYMBOLS, decode, encode

__all__ = [
    "SYMBOLS",
    "TASK_NAMES",
    "Curriculum",
    "LearnToExecute",
    "LearnToExecuteConfig",
    "decode",
    "encode",
    "generate",
    "presets",
    "sequence_lengths",
]
