"""The README (and ``docs/guide.md``, where its commands are spelled out) cannot drift from
the CLI: every ``relmem ...`` command in their fenced shell blocks names a command that exists
and parses with exactly the options written there, without training or reading any data.

- ``relmem train TASK ...`` goes through the trainer's own parser (``relmem.commands.train.
  parse``: the preset, then tyro on the overrides, then the configs' validation), which is
  what ``relmem train`` runs before it builds anything;
- other commands go through their own tyro dataclass (``relmem eval runs/...`` parses its
  placeholder run directory as a path; nothing is opened);
- a command whose module has no known options class must at least accept ``--help`` and list
  every option the block passes.

Placeholders stay as written (``DIR``, ``runs/lte-rmc-...``) except ``TASK`` (each task's
``--help`` is the same parser) and ``--resume RUN_DIR`` (the run would have to exist; the rest
of the line is parsed on the default preset). A task that is not registered is an error unless
it is in ``PENDING`` (documented before it lands).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "docs" / "guide.md"]
RL_TASKS = {"boxworld", "minipacman"}
PENDING = {"squad"}  # README rows kept for a task family still being added


def shell_commands(page: Path) -> list[list[str]]:
    """The ``relmem`` command lines (from ``relmem`` on) of ``page``'s bash/shell blocks."""
    found = []
    for block in re.findall(r"```(?:bash|sh|shell|console)\n(.*?)```", page.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if "relmem" in words:  # also `torchrun ... -m relmem train ...`
                found.append(words[words.index("relmem") + 1 :])
            elif words and words[0].endswith("/relmem"):  # .venv/bin/relmem
                found.append(words[1:])
    return found


COMMANDS = [(page.name, words) for page in PAGES for words in shell_commands(page)]


def test_the_pages_have_commands() -> None:
    assert sum(page == "README.md" for page, _ in COMMANDS) >= 8
    assert any(words[:2] == ["train", "squad"] for _, words in COMMANDS), "the SQuAD spot"


def _without_resume(words: list[str]) -> list[str]:
    if "--resume" in words:
        i = words.index("--resume")
        return words[:i] + words[i + 2 :]
    return words


def _parse_tyro(cls: type, argv: list[str], prog: str) -> None:
    import tyro

    tyro.cli(cls, args=argv, prog=prog)


def _other_command(name: str, argv: list[str]) -> None:
    """Parse ``relmem NAME argv`` with the command's own options class."""
    from relmem.cli import COMMANDS as CLI

    assert name in CLI, f"relmem {name}: not a command (commands: {', '.join(CLI)})"
    module = importlib.import_module(CLI[name][0])
    parse = getattr(module, "parse", None)
    if parse is not None:  # bench
        parse(argv)
        return
    classes = [v for k, v in vars(module).items() if k.endswith("Args") and isinstance(v, type)]
    if len(classes) == 1:
        _parse_tyro(classes[0], argv, f"relmem {name}")
        return
    out = io.StringIO()  # no options class: --help must list every option given
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        module.main(["--help"])
    for word in argv:
        if word.startswith("--"):
            assert word.split("=")[0] in out.getvalue(), f"relmem {name} has no {word}"


@pytest.mark.parametrize(
    ("page", "words"), COMMANDS, ids=[f"{p}:{' '.join(w)[:60]}" for p, w in COMMANDS]
)
def test_command_parses(page: str, words: list[str]) -> None:
    assert words, f"{page}: a bare `relmem`"
    name, argv = words[0], words[1:]
    if name != "train":
        _other_command(name, argv)
        return
    from relmem.commands.train import parse
    from relmem.tasks.registry import list_tasks

    task = argv[0] if argv else ""
    if task in PENDING and task not in list_tasks():
        pytest.skip(f"relmem train {task}: the task is not registered yet")
    if task in RL_TASKS and importlib.util.find_spec("torchrl") is None:
        pytest.skip("the RL tasks need the rl extra")
    if task == "TASK":
        argv = ["nth-farthest", *argv[1:]]
    if "--help" in argv:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
            parse(argv)
        assert exit_.value.code in (0, None) and "--preset" in out.getvalue()
        return
    parse(_without_resume(argv))  # raises (or tyro exits 2) on an unknown or bad option
