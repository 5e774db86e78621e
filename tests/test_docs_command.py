"""``relmem docs`` and the package's ``docs/PAGE.md §N`` citations: each one names a page and
sections that the pages the wheel ships (``docs/*.md``, as ``relmem/docs``) have, and each one
printed to a user (an error, a listing, a ``--help`` page) says how to read it from a wheel
install (``relmem docs PAGE N``). ``scripts/check-wheel`` runs ``relmem docs --check`` on an
installed wheel as well."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from relmem.cli import main as relmem
from relmem.commands import docs

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "relmem"


def test_every_citation_names_a_shipped_page_and_section() -> None:
    found = docs.citations(PACKAGE)
    assert len(found) > 100, "the scanner finds the citations"
    assert any(page == "tasks" and "2.4" in numbers for _, _, page, numbers in found)
    assert docs.docs_directory() == ROOT / "docs", "a checkout reads docs/ beside src/"
    problems = docs.unresolved(ROOT / "docs", PACKAGE)
    assert not problems, "\n".join(problems)


def test_the_scanner_reads_every_citation_form(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "m.py").write_text(
        '"""``docs/tasks.md`` §2.1, §2.3 and ``docs/dnc.md``\n    §15.1-§15.2; docs/rmc.md §4 and '
        '§6; ``docs/runs.md``."""\n# (docs/performance.md §4.1–§4.7)\n'
    )
    assert docs.citations(package) == [
        ("pkg/m.py", 1, "tasks", ["2.1", "2.3"]),
        ("pkg/m.py", 1, "dnc", ["15.1", "15.2"]),
        ("pkg/m.py", 2, "rmc", ["4", "6"]),
        ("pkg/m.py", 2, "runs", []),
        ("pkg/m.py", 3, "performance", ["4.1", "4.7"]),
    ]
    pages = tmp_path / "docs"
    pages.mkdir()
    (pages / "tasks.md").write_text("# Tasks\n## 2. LTE\n### 2.1 Generator\n")
    assert docs.unresolved(pages, package) == [
        "pkg/m.py:1: docs/tasks.md has no §2.3",
        "pkg/m.py:1: docs/dnc.md is not among the pages",
        "pkg/m.py:2: docs/rmc.md is not among the pages",
        "pkg/m.py:2: docs/runs.md is not among the pages",
        "pkg/m.py:3: docs/performance.md is not among the pages",
    ]


def test_section_runs_to_the_next_heading_of_its_level() -> None:
    text = "# T\n## 1. A\nx\n### 1.1 B\ny\n## 2. C\nz\n"
    assert docs.section(text, "1") == "## 1. A\nx\n### 1.1 B\ny\n"
    assert docs.section(text, "1.1") == "### 1.1 B\ny\n"
    assert docs.section(text, "2") == "## 2. C\nz\n"
    assert docs.section(text, "3") is None


def _printed_strings(path: Path) -> list[tuple[int, str]]:
    """The string expressions of a module that are not docstrings (a bare string statement,
    which tyro shows as a field's help, counts as one): errors, notes, help= texts."""
    tree = ast.parse(path.read_text(), str(path))
    bare = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant | ast.JoinedStr)
    }
    bare |= {  # an f-string's literal parts: read with the f-string
        id(part)
        for node in ast.walk(tree)
        if isinstance(node, ast.JoinedStr)
        for part in node.values
    }
    found = []
    for node in ast.walk(tree):
        if id(node) in bare:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.append((node.lineno, node.value))
        elif isinstance(node, ast.JoinedStr):
            parts = [v.value for v in node.values if isinstance(v, ast.Constant)]
            found.append((node.lineno, "".join(str(p) for p in parts)))
    return found


def test_printed_citations_say_how_to_read_them() -> None:
    """One way everywhere: a message or note that cites ``docs/PAGE.md §N`` says
    ``relmem docs PAGE N`` beside it; the docstrings that ``--help`` shows are covered by the
    help page's own line (next test)."""
    unread = [
        f"{path.relative_to(ROOT)}:{line}: {text!r}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, text in _printed_strings(path)
        if re.search(r"docs/[a-z0-9_-]+\.md", text) and "relmem docs " not in text
    ]
    assert not unread, "\n".join(unread)


def test_train_help_says_how_to_read_its_citations(capsys: pytest.CaptureFixture[str]) -> None:
    assert relmem(["train", "nth-farthest", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "docs/tasks.md" in out
    assert "`relmem docs PAGE N`" in out


def test_docs_lists_prints_a_page_and_a_section(capsys: pytest.CaptureFixture[str]) -> None:
    assert relmem(["docs"]) == 0
    listing = capsys.readouterr().out
    for page in ("runs", "tasks", "rmc", "dnc", "rl"):
        assert re.search(rf"^  {page} +\S", listing, re.MULTILINE), page
    assert relmem(["docs", "runs"]) == 0
    assert capsys.readouterr().out == (ROOT / "docs" / "runs.md").read_text()
    for spelling in (["tasks", "3.6"], ["docs/tasks.md", "§3.6"], ["tasks.md", "3.6."]):
        assert relmem(["docs", *spelling]) == 0
        out = capsys.readouterr().out
        assert out.startswith("### 3.6 Where to get the data\n"), spelling
        assert "### 3.7" not in out
    assert relmem(["docs", "--path"]) == 0
    assert capsys.readouterr().out.strip() == str(ROOT / "docs")


def test_docs_refuses_an_unknown_page_or_section(capsys: pytest.CaptureFixture[str]) -> None:
    assert relmem(["docs", "nope"]) == 2
    assert "no page 'nope'; pages: " in capsys.readouterr().err
    assert relmem(["docs", "tasks", "9.9"]) == 2
    err = capsys.readouterr().err
    assert "docs/tasks.md has no section '9.9'; its sections: 1, 1.1," in err


def test_docs_check_passes_on_the_checkout(capsys: pytest.CaptureFixture[str]) -> None:
    assert relmem(["docs", "--check"]) == 0, capsys.readouterr().out
    assert ", 0 unresolved, in " in capsys.readouterr().out
