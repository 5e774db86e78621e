"""The Learning to Execute program generator (``docs/tasks.md`` §2.1, §2.3).

A program of literal length l and nesting k chains k operations to the left: each operation
draws its operator uniformly from the task's set, takes the previous operation's expression
(in parentheses) as its first operand and fresh literals of exactly l digits for the others.
The target is the value modulo ``10^(l+1)`` (floor modulo) for program tasks, the resulting
digit string for the memorisation tasks (copy, reverse, double; nesting 1 only).

:func:`generate` is the public face: ``generate('addition', 5, 2, n, seed)`` gives ``n``
pairs such as ``('(65125+15306)+77013', '157444')``, a pure function of its arguments.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from relmem.validation import check_choice, check_int

Operand = tuple[int | str, str]  # (value, code)


@dataclass(frozen=True)
class Operation:
    """One operator: ``apply(operand values, operand codes, rng) -> (value, code)``."""

    name: str
    arity: int
    apply: Callable[[list, list[str], random.Random], tuple[int | str, str]]


def _if(values: list, codes: list[str], rng: random.Random) -> tuple[int, str]:
    a, b, c, d = values
    comparator = rng.choice("<>")
    taken = b < c if comparator == "<" else b > c
    return (a if taken else d), f"{codes[0]}if{codes[1]}{comparator}{codes[2]}else{codes[3]}"


def _for(values: list, codes: list[str], rng: random.Random) -> tuple[int, str]:
    times = rng.randint(1, 9)
    return values[0] + times * values[1], f"x={codes[0]}for[{times}]x+={codes[1]}"


ADD = Operation("add", 2, lambda v, c, _: (v[0] + v[1], f"{c[0]}+{c[1]}"))
SUB = Operation("sub", 2, lambda v, c, _: (v[0] - v[1], f"{c[0]}-{c[1]}"))
MUL = Operation("mul", 2, lambda v, c, _: (v[0] * v[1], f"{c[0]}*{c[1]}"))
IF = Operation("if", 4, _if)
FOR = Operation("for", 2, _for)
COPY = Operation("copy", 1, lambda v, c, _: (str(v[0]), c[0]))
REVERSE = Operation("reverse", 1, lambda v, c, _: (str(v[0])[::-1], c[0]))
DOUBLE = Operation("double", 1, lambda v, c, _: (str(v[0]) * 2, c[0]))

TASKS: dict[str, tuple[Operation, ...]] = {
    "addition": (ADD,),
    "control": (IF, FOR),
    "program": (ADD, SUB, MUL, IF, FOR),  # the reference's ALL: the paper's "full program"
    "algebra": (ADD, SUB, MUL),
    "alg-ctrl": (ADD, SUB, IF),
    "copy": (COPY,),
    "reverse": (REVERSE,),
    "double": (DOUBLE,),
}
TASK_NAMES: tuple[str, ...] = tuple(TASKS)
MEMORISATION: tuple[str, ...] = ("copy", "reverse", "double")


# The largest literal length and nesting accepted (the paper's are 5 and 2; Fig. 8 goes to 6
# and 3). Programs at L = 100, N = 2 are 520 characters; far beyond, a literal of L digits
# outgrows Python's integer-string conversion (4300 digits) and the inputs any core can read.
MAX_LENGTH = 100
MAX_NESTING = 100


def check_task(task: str, length: int, nesting: int, *, owner: str = "generate") -> None:
    """Reject an unknown task, a length or nesting below 1, and nesting above 1 for the
    memorisation tasks (their code would gain parentheses; ``docs/tasks.md`` §2.1).

    Raises:
        ValueError: naming the argument and what is allowed.
    """
    check_choice("task", task, TASK_NAMES, owner=owner)
    check_int("length", length, 1, owner=owner, maximum=MAX_LENGTH)
    check_int("nesting", nesting, 1, owner=owner, maximum=MAX_NESTING)
    if task in MEMORISATION and nesting != 1:
        raise ValueError(
            f"{owner}: nesting must be 1 for the memorisation task {task!r}, got {nesting}"
        )


def program(task: str, length: int, nesting: int, rng: random.Random) -> tuple[str, str]:
    """One ``(code, target)`` pair drawn with ``rng`` (arguments unchecked; see
    :func:`check_task`)."""
    operations = TASKS[task]
    low, high = 10 ** (length - 1), 10**length - 1
    stack: Operand | None = None
    for _ in range(nesting):
        operation = rng.choice(operations)
        values, codes = [], []
        for i in range(operation.arity):
            if i == 0 and stack is not None:
                value, code = stack
                stack = None
            else:
                value = rng.randint(low, high)
                code = str(value)
            values.append(value)
            codes.append(code)
        value, code = operation.apply(values, codes, rng)
        stack = (value, f"({code})")
    assert stack is not None
    value, code = stack
    target = value if isinstance(value, str) else str(value % 10 ** (length + 1))
    return code[1:-1], target


def generate(task: str, length: int, nesting: int, n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` programs of ``task`` with literals of exactly ``length`` digits and ``nesting``
    operations, as ``(code, target)`` strings; the same arguments give the same list.

    Args:
        task: 'addition', 'control', 'program', 'algebra', 'alg-ctrl', 'copy', 'reverse' or
            'double'.
        length: digits per literal, >= 1.
        nesting: operations per program, >= 1 (exactly 1 for copy, reverse and double).
        n: number of programs, >= 0.
        seed: any integer.

    Raises:
        ValueError: naming the bad argument and the allowed values.
    """
    check_task(task, length, nesting)
    check_int("n", n, 0, owner="generate")
    check_int("seed", seed, -(2**63), owner="generate")
    rng = random.Random(seed)
    return [program(task, length, nesting, rng) for _ in range(n)]


def sequence_lengths(task: str, max_length: int, max_nesting: int) -> tuple[int, int]:
    """``(T_in, T_out)``: the padded input and target steps for the largest programs of
    ``task`` (``docs/tasks.md`` §2.3)."""
    L, N = max_length, max_nesting
    if task in ("copy", "reverse"):
        return L + 1, L + 1
    if task == "double":
        return L + 1, 2 * L + 1
    return (3 * L + 10) * (N - 1) + (4 * L + 10) + 2 * (N - 1), 2 * L
