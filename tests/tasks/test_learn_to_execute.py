"""Learning to Execute data (``docs/tasks.md`` §2.1-§2.4): programs checked by an evaluator
written here (it parses the mini-language and runs it as Python, loops included), literal
lengths, uniform draws, the vocabulary and layouts, the metrics, the curricula, bad arguments."""

from __future__ import annotations

import math
import operator
from collections import Counter

import pytest
import torch

from relmem.tasks.base import step_generator
from relmem.tasks.learn_to_execute import (
    SYMBOLS,
    Curriculum,
    LearnToExecute,
    LearnToExecuteConfig,
    decode,
    encode,
    generate,
    sequence_lengths,
)
from relmem.tasks.learn_to_execute.programs import TASKS

PROGRAM_TASKS = ["addition", "control", "program", "algebra", "alg-ctrl"]
MEMORISATION = ["copy", "reverse", "double"]
COMPARE = {"<": operator.lt, ">": operator.gt}
ARITHMETIC = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def top_level(code: str, word: str) -> int:
    """The first index of ``word`` outside parentheses (-1 if none)."""
    depth = 0
    for i, char in enumerate(code):
        depth += (char == "(") - (char == ")")
        if depth == 0 and code.startswith(word, i):
            return i
    return -1


def run_program(code: str) -> int:
    """The value of a program, by its grammar: ``(e)``, ``x=A for[k] x+=B``,
    ``A if B<C else D``, ``A op B`` (left-deep), or a literal."""
    if code.startswith("(") and top_level(code, ")") == len(code) - 1:
        return run_program(code[1:-1])
    if code.startswith("x="):
        loop = top_level(code, "for[")
        times = int(code[loop + 4 : code.index("]", loop)])
        body = code[code.index("]", loop) + 1 :]
        assert body.startswith("x+=")
        x = run_program(code[2:loop])
        for _ in range(times):
            x += run_program(body[3:])
        return x
    branch = top_level(code, "if")
    if branch >= 0:
        orelse = top_level(code, "else")
        condition = code[branch + 2 : orelse]
        comparator = next(c for c in "<>" if c in condition)
        b, c = condition.split(comparator)
        taken = COMPARE[comparator](run_program(b), run_program(c))
        return run_program(code[:branch] if taken else code[orelse + 4 :])
    cuts = [
        i for i, char in enumerate(code) if char in ARITHMETIC and top_level(code[i:], char) == 0
    ]
    depth_zero = [i for i in cuts if code[:i].count("(") == code[:i].count(")")]
    if depth_zero:
        i = depth_zero[-1]
        return ARITHMETIC[code[i]](run_program(code[:i]), run_program(code[i + 1 :]))
    assert code.isdigit(), code
    return int(code)


def expected_target(task: str, code: str, length: int) -> str:
    if task == "copy":
        return code
    if task == "reverse":
        return code[::-1]
    if task == "double":
        return code + code
    return str(run_program(code) % 10 ** (length + 1))


def literals(code: str) -> list[str]:
    """The literals of a program (digits not right after ``for[``)."""
    found, current = [], ""
    for i, char in enumerate(code + " "):
        if char.isdigit():
            current += char
        elif current:
            if not code[: i - len(current)].endswith("for["):
                found.append(current)
            current = ""
    return found


def test_the_spec_examples_evaluate_to_their_targets() -> None:
    examples = {
        "(65125+15306)+77013": "157444",
        "x=(76150if28254<46941else28316)for[3]x+=79804": "315562",
        "(x=72522for[9]x+=68024)*18163": "896294",
    }
    for code, target in examples.items():
        assert expected_target("program", code, 5) == target
    assert expected_target("reverse", "90202", 5) == "20209"
    assert expected_target("double", "52625", 5) == "5262552625"


@pytest.mark.parametrize("task", PROGRAM_TASKS + MEMORISATION)
def test_every_program_evaluates_to_its_target(task: str) -> None:
    nestings = [1] if task in MEMORISATION else [1, 2, 3]
    for length in range(1, 7):
        for nesting in nestings:
            pairs = generate(task, length, nesting, 40, seed=length * 10 + nesting)
            t_in, t_out = sequence_lengths(task, length, nesting)
            for code, target in pairs:
                assert " " not in code
                assert target == expected_target(task, code, length), (code, target)
                assert len(code) <= t_in and len(target) <= t_out
                assert all(len(x) == length for x in literals(code)), code
                assert code.count("(") == nesting - 1, code


def test_generate_is_a_pure_function_of_its_arguments() -> None:
    assert generate("program", 4, 3, 50, 7) == generate("program", 4, 3, 50, 7)
    assert generate("program", 4, 3, 50, 7) != generate("program", 4, 3, 50, 8)
    assert generate("addition", 2, 1, 0, 1) == []


def test_literals_are_uniform_over_exactly_length_digits() -> None:
    digits = Counter(
        x[0] for code, _ in generate("addition", 3, 3, 3000, 1) for x in literals(code)
    )
    assert set(digits) == set("123456789")  # never a leading zero
    counts = [digits[d] for d in "123456789"]
    assert chi_square(counts, [sum(counts) / 9] * 9) < 26.1  # df 8, p = 0.001


def chi_square(observed: list[int], expected: list[float]) -> float:
    return sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True))


def test_operator_and_comparator_draws_are_uniform() -> None:
    pairs = generate("program", 2, 1, 4000, 3)
    kinds = Counter()
    comparators = Counter()
    loops = Counter()
    for code, _ in pairs:
        if code.startswith("x="):
            kinds["for"] += 1
            loops[code[code.index("for[") + 4]] += 1
        elif "if" in code:
            kinds["if"] += 1
            comparators["<" if "<" in code else ">"] += 1
        else:
            kinds[next(c for c in "+-*" if c in code)] += 1
    assert set(kinds) == {"+", "-", "*", "if", "for"} and len(TASKS["program"]) == 5
    assert chi_square(list(kinds.values()), [800.0] * 5) < 18.5  # df 4, p = 0.001
    n = comparators["<"] + comparators[">"]
    assert abs(comparators["<"] - n / 2) < 3.3 * math.sqrt(n / 4)  # binomial, p ~ 0.001
    assert set(loops) == set("123456789")
    assert chi_square([loops[d] for d in "123456789"], [sum(loops.values()) / 9] * 9) < 26.1


def test_mix_draws_length_and_nesting_uniformly_and_independently() -> None:
    curriculum = Curriculum("mix", 5, 3)
    lengths, nestings = curriculum.draw(9000, step_generator(torch.device("cpu"), 4))
    assert lengths.min() == 1 and lengths.max() == 5 and nestings.max() == 3
    pairs = Counter(zip(lengths.tolist(), nestings.tolist(), strict=True))
    assert len(pairs) == 15
    assert chi_square(list(pairs.values()), [600.0] * 15) < 36.1  # df 14, p = 0.001


def test_vocabulary_has_the_fixed_indices_and_round_trips() -> None:
    assert len(SYMBOLS) == 45
    assert SYMBOLS[5] == "!" and SYMBOLS[11] == "." and SYMBOLS[44] == "~"
    assert [SYMBOLS[13 + d] for d in range(10)] == list("0123456789")
    assert SYMBOLS.index("x") == 43 and SYMBOLS.index("range") == 41
    for code, target in generate("program", 5, 3, 200, 5):
        assert decode(encode(code)) == code and decode(encode(target)) == target
    with pytest.raises(ValueError, match="'y' is not in the LTE vocabulary"):
        encode("y")


@pytest.mark.parametrize("teacher_forcing", [False, True])
def test_batches_are_padded_with_dots_and_round_trip(teacher_forcing: bool) -> None:
    config = LearnToExecuteConfig(max_length=3, max_nesting=2, teacher_forcing=teacher_forcing)
    task = LearnToExecute(config)
    assert (task.input_steps, task.output_steps) == ((3 * 3 + 10) + (4 * 3 + 10) + 2, 6)
    pairs = generate("program", 3, 2, 16, 9)
    batch = task.encode(pairs)
    t_in = task.input_steps
    assert batch.inputs.shape == (16, t_in + (6 if teacher_forcing else 0))
    assert batch.targets.shape == batch.mask.shape == (16, 6)
    for row, (code, target) in enumerate(pairs):
        program = batch.inputs[row, :t_in]
        assert decode(program) == code + "." * (t_in - len(code))
        assert decode(batch.targets[row]) == target + "." * (6 - len(target))
        assert batch.mask[row].tolist() == [1.0] * len(target) + [0.0] * (6 - len(target))
        if teacher_forcing:
            assert decode(batch.inputs[row, t_in:]) == ("~" + target + ".....")[:6]


def test_spec_sequence_lengths() -> None:
    assert sequence_lengths("program", 5, 2) == (57, 10)
    assert sequence_lengths("addition", 6, 3) == (94, 12)
    assert sequence_lengths("copy", 5, 1) == sequence_lengths("reverse", 5, 1) == (6, 6)
    assert sequence_lengths("double", 5, 1) == (6, 11)


def test_metrics_on_hand_made_predictions() -> None:
    task = LearnToExecute(LearnToExecuteConfig(max_length=2, max_nesting=1))
    batch = task.encode([("12+34", "46"), ("50-99", "951"), ("1*2", "2")])
    logits = torch.full((3, 4, 45), -10.0)
    guesses = ["46..", "9x1.", "2999"]  # row 0 all right; row 1 one wrong; padding ignored
    for row, text in enumerate(guesses):
        for t, char in enumerate(text):
            logits[row, t, encode(char)[0]] = 10.0
    measures = task.measure(logits, batch)
    assert measures["accuracy"].total.tolist() == [2.0, 2.0, 1.0]
    assert measures["accuracy"].count.tolist() == [2.0, 3.0, 1.0]
    assert measures["accuracy"].value().item() == pytest.approx(5 / 6)
    assert measures["solved"].total.tolist() == [1.0, 0.0, 1.0]
    loss = measures["loss"]
    assert loss.count.tolist() == [2.0, 3.0, 1.0]
    all_positions = LearnToExecute(
        LearnToExecuteConfig(max_length=2, max_nesting=1, loss_norm="all_positions")
    ).measure(logits, batch)["loss"]
    assert all_positions.count.tolist() == [4.0, 4.0, 4.0]
    assert torch.equal(all_positions.total, loss.total)


def test_naive_and_combine_advance_on_a_falling_loss() -> None:
    naive = Curriculum("naive", 2, 2, min_tries=5)
    for loss in [5.0, 4.0, 3.0, 2.0]:
        assert not naive.update(loss)
    assert naive.update(1.0) and (naive.length, naive.nesting) == (2, 1)
    for loss in [1.0] * 4:
        assert not naive.update(loss)
    assert naive.update(1.0) and naive.ceiling() == (2, 2)  # flat: trend 0 < 0.1 advances too
    for _ in range(5):
        rising = naive.update(10.0 + _)
    assert not rising and naive.ceiling() == (2, 2)
    lengths, nestings = naive.draw(50, step_generator(torch.device("cpu"), 1))
    assert set(lengths.tolist()) == {2} and set(nestings.tolist()) == {2}
    combine = Curriculum("combine", 3, 1, min_tries=5)
    for loss in [5.0, 4.0, 3.0, 2.0, 1.0]:
        combine.update(loss)
    lengths, _ = combine.draw(400, step_generator(torch.device("cpu"), 2))
    assert set(lengths.tolist()) == {1, 2}


def test_rising_loss_does_not_advance_and_abs_trend_waits_for_a_flat_one() -> None:
    naive = Curriculum("naive", 5, 1)
    assert not any(naive.update(1.5**i) for i in range(12))
    steep = Curriculum("naive", 5, 1, min_tries=5, abs_trend=True)
    assert not any(steep.update(5.0 - i) for i in range(5))  # |trend| = 1/3 > 0.1
    assert steep.length == 1
    baseline, mix = Curriculum("baseline", 4, 2), Curriculum("mix", 4, 2)
    for curriculum in (baseline, mix):
        assert not any(curriculum.update(1.0 / (i + 1)) for i in range(20))
        assert curriculum.ceiling() == (4, 2)


def test_curriculum_state_round_trips() -> None:
    a = Curriculum("combine", 5, 2, min_tries=5)
    for loss in [3.0, 2.0, 1.0, 0.5, 0.2, 0.1, 0.09]:
        a.update(loss)
    b = Curriculum("combine", 5, 2, min_tries=5)
    b.load_state_dict(a.state_dict())
    assert b.state_dict() == a.state_dict()
    assert a.update(0.05) == b.update(0.05) and a.state_dict() == b.state_dict()


def test_sample_is_a_pure_function_of_the_generator() -> None:
    task = LearnToExecute(LearnToExecuteConfig(task_type="control"))
    a = task.sample(16, step_generator(torch.device("cpu"), 0, 1, 5), 5)
    b = task.sample(16, step_generator(torch.device("cpu"), 0, 1, 5), 5)
    assert all(torch.equal(x, y) for x, y in zip(a[:4], b[:4], strict=True))
    levels = task.held_out(torch.device("cpu"))
    assert levels.size == 12800 and levels.groups is None
    assert decode(levels.inputs[0]).rstrip(".") == generate("control", 5, 2, 1, 20141017)[0][0]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: generate("division", 5, 2, 1, 0), "generate: task must be one of 'addition'"),
        (lambda: generate("addition", 0, 2, 1, 0), "generate: length must be an integer in 1..100"),
        (
            lambda: generate("addition", 5, 0, 1, 0),
            "generate: nesting must be an integer in 1..100",
        ),
        # a literal of 100000 digits failed in Python's integer-string conversion, unnamed
        (lambda: generate("addition", 100_000, 2, 1, 0), "length must be an integer in 1..100"),
        (lambda: generate("copy", 5, 4, 1, 0), "nesting must be 1 for the memorisation task"),
        (lambda: generate("copy", 5, 1, -1, 0), "generate: n must be an integer >= 0"),
        (lambda: LearnToExecuteConfig(task_type="x"), "task.task_type must be one of 'addition'"),
        (lambda: LearnToExecuteConfig(max_length=0), "task.max_length must be >= 1"),
        (
            lambda: LearnToExecuteConfig(max_length=100_000),
            "task.max_length must be <= 100 (the paper's L and N are 5 and 2), got 100000",
        ),
        (lambda: LearnToExecuteConfig(max_nesting=101), "task.max_nesting must be <= 100"),
        (
            lambda: LearnToExecuteConfig(task_type="double", max_nesting=4),
            "task.max_nesting must be 1 for the memorisation task 'double', got 4",
        ),
        (lambda: LearnToExecuteConfig(curriculum="easy"), "task.curriculum must be one of"),
        (lambda: LearnToExecuteConfig(loss_norm="sum"), "task.loss_norm must be one of"),
    ],
)
def test_bad_arguments_name_the_argument_and_the_allowed_values(call, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


def test_length_only_baseline_is_far_from_solving() -> None:
    task = LearnToExecute(LearnToExecuteConfig(task_type="addition", test_size=500))
    accuracy, solved = task.length_only_baseline()
    assert 0.1 < accuracy < 0.5 and solved < 0.01


@pytest.mark.parametrize("curriculum", ["mix", "naive", "combine"])
def test_the_evaluation_batch_is_drawn_at_the_top_level(curriculum: str) -> None:
    """The paper's best score is over evaluations at (L, N); the fresh evaluation batch came
    from the training curriculum (Mix: every level, easy ones included), which put the best
    batch at 17.9% against a held-out 14.3% in one run. Training batches are unchanged."""
    config = LearnToExecuteConfig(max_length=3, max_nesting=2, curriculum=curriculum)
    task = LearnToExecute(config)
    top = task.level_group(3, 2)
    fresh = task.sample_evaluation(64, step_generator(torch.device("cpu"), 0, 2, 0))
    assert fresh.groups.tolist() == [top] * 64
    training = task.sample(256, step_generator(torch.device("cpu"), 0, 1, 0))
    if curriculum == "mix":
        assert len(set(training.groups.tolist())) > 1
