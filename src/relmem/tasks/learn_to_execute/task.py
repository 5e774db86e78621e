"""Learning to Execute for the trainer (``relmem train lte``; ``docs/tasks.md`` §2).

Batches hold token ids: ``inputs [B, T_in]`` (programs right-padded with ``.``; with teacher
forcing ``[B, T_in + T_out]``, the decoder's ``[~] + target[:-1]`` appended), ``targets
[B, T_out]`` and ``mask [B, T_out]`` (1 inside each true output length). The model is the
sequence-to-sequence one of :mod:`relmem.models.seq2seq` around ``--model``'s core, which
finds each program's true length from its padding. Data is a pure function of the step's
generator and the curriculum's level; the level moves only in :meth:`after_evaluation` and is
saved in checkpoints (:meth:`state_dict`), so a resumed run sees the same batches.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
import torch.nn.functional as F
import tyro
from torch import Tensor

from relmem.models.spec import DecoderSpec, TaskSpec
from relmem.tasks.base import Batch, Measure, MetricSpec, Task, derive_seed
from relmem.tasks.learn_to_execute import vocabulary as vocab
from relmem.tasks.learn_to_execute.curriculum import CURRICULA, Curriculum
from relmem.tasks.learn_to_execute.programs import (
    MAX_LENGTH,
    MAX_NESTING,
    MEMORISATION,
    TASK_NAMES,
    generate,
    program,
    sequence_lengths,
)
from relmem.tasks.registry import register_task
from relmem.validation import check_at_least, check_at_most, check_choice, check_positive

TaskType = Literal[
    "addition", "control", "program", "algebra", "alg-ctrl", "copy", "reverse", "double"
]
CHAR_ACCURACY = MetricSpec("accuracy", True, "per-character accuracy", "acc", percent=True)
SOLVED = MetricSpec("solved", True, "solved rate", "solved", percent=True)


@dataclass
class LearnToExecuteConfig:
    """Learning to Execute settings (the ``--task.*`` options of ``relmem train lte``).

    Attributes:
        task_type: 'addition', 'control', 'program' (the paper's full programs), 'algebra',
            'alg-ctrl', or the memorisation tasks 'copy', 'reverse', 'double'.
        max_length: L, the largest literal length (paper: 5).
        max_nesting: N, the largest nesting (paper: 2; 1 for the memorisation tasks).
        curriculum: 'mix' (the paper's), 'baseline', 'naive' or 'combine'
            (``docs/tasks.md`` §2.4).
        min_tries: evaluation losses before the curriculum may advance (reference: 10).
        threshold: advance when the relative loss trend is below it (reference: 0.1).
        abs_trend: compare the trend's absolute value with the threshold instead.
        loss_norm: 'valid' (mean over the true output characters) or 'all_positions' (the
            reference: the sum over them divided by all ``B·T_out`` positions).
        teacher_forcing: the decoder reads ``[~] + target[:-1]`` instead of zeros, in training
            and in evaluation alike (not the paper's set-up; evaluation then sees the true
            previous characters).
        separate_decoder: the decoder is a second core (default: the encoder's core).
        test_size: held-out programs at (L, N) (paper: 12,800).
        test_seed: seed of the held-out set (independent of the training seed).
        breakdown_size: programs per (length, nesting) level in the set ``relmem eval``
            breaks the accuracy down on.
    """

    task_type: Annotated[TaskType, tyro.conf.arg(aliases=("--task",))] = "program"
    max_length: int = 5
    max_nesting: int = 2
    curriculum: Literal["baseline", "naive", "mix", "combine"] = "mix"
    min_tries: int = 10
    threshold: float = 0.1
    abs_trend: bool = False
    loss_norm: Literal["valid", "all_positions"] = "valid"
    teacher_forcing: bool = False
    separate_decoder: bool = False
    test_size: int = 12800
    test_seed: int = 20141017
    breakdown_size: int = 1000

    def __post_init__(self) -> None:
        check_choice("task.task_type", self.task_type, TASK_NAMES)
        check_at_least("task.", self, max_length=1, max_nesting=1, min_tries=1)
        note = " (the paper's L and N are 5 and 2)"
        check_at_most("task.", self, note, max_length=MAX_LENGTH, max_nesting=MAX_NESTING)
        check_at_least("task.", self, test_size=1, breakdown_size=1)
        if self.task_type in MEMORISATION and self.max_nesting != 1:
            raise ValueError(
                f"task.max_nesting must be 1 for the memorisation task {self.task_type!r}, "
                f"got {self.max_nesting}"
            )
        check_choice("task.curriculum", self.curriculum, CURRICULA)
        check_choice("task.loss_norm", self.loss_norm, ("valid", "all_positions"))
        check_positive("task.", self, "threshold")


class LearnToExecute(Task):
    """Learning to Execute; groups are the (length, nesting) levels.

    Args:
        config: the task's settings.
    """

    metric = CHAR_ACCURACY
    extra_metrics = (SOLVED,)
    group_name = "length and nesting"

    def __init__(self, config: LearnToExecuteConfig) -> None:
        self.config = config
        self.input_steps, self.output_steps = sequence_lengths(
            config.task_type, config.max_length, config.max_nesting
        )
        self.spec = TaskSpec(
            input_size=vocab.VOCAB_SIZE,
            seq_len=self.input_steps,
            output_size=vocab.VOCAB_SIZE,
            output="per_step_mlp",
            encoding="one_hot",
            decoder=DecoderSpec(
                self.output_steps, vocab.PAD, config.teacher_forcing, config.separate_decoder
            ),
        )
        self.num_groups = config.max_length * config.max_nesting
        self.curriculum = Curriculum(
            config.curriculum,
            config.max_length,
            config.max_nesting,
            config.min_tries,
            config.threshold,
            config.abs_trend,
        )

    def encode(self, pairs: list[tuple[str, str]], groups: Tensor | None = None) -> Batch:
        """A batch of ``(code, target)`` pairs on the CPU (layout: the module's docstring)."""
        codes, targets = zip(*pairs, strict=True) if pairs else ((), ())
        inputs, _ = vocab.pad_batch(codes, self.input_steps)  # [B, T_in]
        target_ids, target_lengths = vocab.pad_batch(targets, self.output_steps)  # [B, T_out]
        steps = torch.arange(self.output_steps)
        mask = (steps < target_lengths.unsqueeze(1)).float()  # [B, T_out]
        if self.config.teacher_forcing:
            start = torch.full((len(pairs), 1), vocab.START, dtype=torch.int64)
            inputs = torch.cat([inputs, start, target_ids[:, :-1]], dim=1)
        return Batch(inputs, target_ids, groups, mask)

    def level_group(self, length: Any, nesting: Any) -> Any:
        """The group id ``(length - 1)·N + (nesting - 1)`` (of ints, or elementwise of
        ``[B]`` tensors)."""
        return (length - 1) * self.config.max_nesting + (nesting - 1)

    def group_label(self, group: int) -> str:
        """``'length l, nesting k'``."""
        length, nesting = divmod(group, self.config.max_nesting)
        return f"length {length + 1}, nesting {nesting + 1}"

    def sample(self, batch_size: int, generator: torch.Generator, step: int = 0) -> Batch:
        """``batch_size`` programs at the curriculum's levels, drawn with ``generator``."""
        return self._programs(*self.curriculum.draw(batch_size, generator), generator)

    def sample_evaluation(
        self, batch_size: int, generator: torch.Generator, step: int = 0
    ) -> Batch:
        """``batch_size`` fresh programs at (L, N), where the paper evaluates (the Baseline
        level, as :meth:`held_out`): the best-batch figure is the paper's best score over the
        evaluations, not a score on the training curriculum's easier levels."""
        c = self.config
        level = torch.full((batch_size,), c.max_length), torch.full((batch_size,), c.max_nesting)
        return self._programs(*level, generator)

    def _programs(self, lengths: Tensor, nestings: Tensor, generator: torch.Generator) -> Batch:
        """Programs at the levels ``lengths [B]``, ``nestings [B]``, drawn with ``generator``."""
        device = generator.device
        seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=device))
        rng = random.Random(seed)
        task = self.config.task_type
        pairs = [
            program(task, int(l), int(k), rng)
            for l, k in zip(lengths.tolist(), nestings.tolist(), strict=True)
        ]
        return self.encode(pairs, self.level_group(lengths, nestings)).to(device)

    def held_out(self, device: torch.device) -> Batch:
        """``test_size`` programs at (L, N), the paper's evaluation (Baseline curriculum)."""
        c = self.config
        pairs = generate(c.task_type, c.max_length, c.max_nesting, c.test_size, c.test_seed)
        return self.encode(pairs).to(device)

    def breakdown(self, device: torch.device) -> Batch:
        """``breakdown_size`` programs at every (length, nesting) level, grouped by level."""
        c = self.config
        pairs: list[tuple[str, str]] = []
        groups: list[int] = []
        for length in range(1, c.max_length + 1):
            for nesting in range(1, c.max_nesting + 1):
                seed = derive_seed(c.test_seed, length, nesting)
                pairs += generate(c.task_type, length, nesting, c.breakdown_size, seed)
                groups += [self.level_group(length, nesting)] * c.breakdown_size
        return self.encode(pairs, torch.tensor(groups)).to(device)

    def measure(self, logits: Tensor, batch: Batch) -> dict[str, Measure]:
        """Cross-entropy, per-character accuracy and solved rate per program.

        Args:
            logits: ``[B, T_out, 45]``.
            batch: ``targets [B, T_out]`` and ``mask [B, T_out]``.
        """
        assert batch.mask is not None
        mask = batch.mask.float()  # [B, T_out]
        xent = F.cross_entropy(logits.float().transpose(1, 2), batch.targets, reduction="none")
        valid = mask.sum(1)  # [B] true output lengths
        positions = (
            valid if self.config.loss_norm == "valid" else torch.full_like(valid, mask.shape[1])
        )
        correct = (logits.argmax(-1) == batch.targets).float() * mask  # [B, T_out]
        right = correct.sum(1)  # [B]
        return {
            "loss": Measure((xent * mask).sum(1), positions),
            "accuracy": Measure(right, valid),
            "solved": Measure.per_example((right == valid).float()),
        }

    def after_evaluation(self, metrics: dict[str, float]) -> dict[str, float]:
        """Feed the held-out loss to the curriculum; log its level (the largest (l, k) drawn)."""
        self.curriculum.update(metrics["eval/loss"])
        length, nesting = self.curriculum.ceiling()
        return {"curriculum/length": float(length), "curriculum/nesting": float(nesting)}

    def state_dict(self) -> dict[str, Any]:
        """The curriculum's level and loss window."""
        return {"curriculum": self.curriculum.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (``{}``, from a run without it, changes nothing)."""
        if "curriculum" in state:
            self.curriculum.load_state_dict(state["curriculum"])

    def export_vocabulary(self) -> list[str]:
        """The 45 symbols in index order (programs and targets alike)."""
        return list(vocab.SYMBOLS)

    def plot_levels(self) -> dict[str, float]:
        """The per-character accuracy of guessing from the output length alone."""
        accuracy, _ = self.length_only_baseline()
        return {f"output length alone {100 * accuracy:.1f}%": accuracy}

    def length_only_baseline(self) -> tuple[float, float]:
        """``(per-character accuracy, solved rate)`` on the held-out set of the best guess that
        knows only each target's length: per (length, position), the most frequent character
        of ``test_size`` other programs drawn at (L, N)."""
        c = self.config
        fit = generate(c.task_type, c.max_length, c.max_nesting, c.test_size, c.test_seed + 1)
        test = generate(c.task_type, c.max_length, c.max_nesting, c.test_size, c.test_seed)
        counts: defaultdict[tuple[int, int], Counter[str]] = defaultdict(Counter)
        for _, target in fit:
            for i, char in enumerate(target):
                counts[len(target), i][char] += 1
        guess = {key: chars.most_common(1)[0][0] for key, chars in counts.items()}
        right = total = solved = 0
        for _, target in test:
            hits = sum(guess.get((len(target), i)) == char for i, char in enumerate(target))
            right, total, solved = right + hits, total + len(target), solved + (hits == len(target))
        return right / total, solved / len(test)


@register_task("lte", LearnToExecuteConfig)
def build_learn_to_execute(config: LearnToExecuteConfig) -> LearnToExecute:
    """Registry builder for ``relmem train lte``."""
    return LearnToExecute(config)
