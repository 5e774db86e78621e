"""``relmem docs [PAGE [SECTION]]``: the documentation pages, from a checkout or a wheel.

Help texts, error messages and docstrings cite the pages as ``docs/PAGE.md §N``; ``relmem docs
PAGE N`` prints that section, ``relmem docs PAGE`` the page, ``relmem docs`` lists the pages.
The repository keeps one copy of the pages, in ``docs/``; the wheel carries them as
``relmem/docs`` (``setup.py`` maps the folder into the package), and a checkout or an editable
install reads ``docs/`` beside ``src/``.

``relmem docs --check`` scans the package's own sources for ``docs/PAGE.md §N`` citations and
exits 1 naming each one whose page or section the pages here lack (the test suite runs it on
the checkout, ``scripts/check-wheel`` on an installed wheel).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]  # .../relmem

_HEADING = re.compile(r"^(#+)\s+(?:§\s*)?(\d+(?:\.\d+)*)\.?(?:\s|$)")
"""A numbered heading, ``## 3. Title`` or ``### 3.6 Title``: its level and its number."""

_CITATION = re.compile(
    r"docs/([a-z0-9_-]+)\.md`{0,2}((?:(?:\s|,|and|[-–])*§\d+(?:\.\d+)*)*)", re.MULTILINE
)
"""``docs/PAGE.md`` (in backticks or not), then the ``§N`` that follow it: ``§1.2``,
``§2.1, §2.3``, ``§4 and §6``, ``§15.1-§15.2`` (each end of a range is a section too)."""


def docs_directory() -> Path:
    """The pages' folder: the wheel's ``relmem/docs``, else the checkout's ``docs/``.

    Raises:
        FileNotFoundError: neither exists (a build that left the pages out).
    """
    shipped = _PACKAGE / "docs"
    if shipped.is_dir():
        return shipped
    checkout = _PACKAGE.parents[1]  # src/relmem -> the repository
    if (checkout / "docs").is_dir() and (checkout / "pyproject.toml").is_file():
        return checkout / "docs"
    raise FileNotFoundError(
        f"no documentation pages: neither {shipped} (a wheel's) nor {checkout / 'docs'} "
        "(a checkout's) exists; reinstall relmem"
    )


def pages(directory: Path) -> dict[str, Path]:
    """``name -> file`` for every page (``runs`` for ``runs.md``), sorted by name."""
    return {path.stem: path for path in sorted(directory.glob("*.md"))}


def title(path: Path) -> str:
    """The page's first ``# `` heading, without the hashes ('' when it has none)."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return ""


def section(text: str, number: str) -> str | None:
    """The section numbered ``number`` (``'3.6'``) of a page: its heading and every line up to
    the next heading of the same or a higher level; None when the page has no such heading."""
    lines = text.splitlines()
    for start, line in enumerate(lines):
        match = _HEADING.match(line)
        if match is None or match.group(2) != number:
            continue
        level = len(match.group(1))
        end = start + 1
        while end < len(lines):
            heading = re.match(r"^(#+)\s", lines[end])
            if heading is not None and len(heading.group(1)) <= level:
                break
            end += 1
        return "\n".join(lines[start:end]).rstrip() + "\n"
    return None


def citations(package: Path = _PACKAGE) -> list[tuple[str, int, str, list[str]]]:
    """Every ``docs/PAGE.md §N`` citation in the package's ``.py`` and ``.cpp`` files, as
    ``(file relative to the package's parent, line, page, [section numbers])``."""
    found = []
    for path in sorted([*package.rglob("*.py"), *package.rglob("*.cpp")]):
        text = path.read_text(encoding="utf-8")
        for match in _CITATION.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            numbers = re.findall(r"§(\d+(?:\.\d+)*)", match.group(2))
            where = path.relative_to(package.parent).as_posix()
            found.append((where, line, match.group(1), numbers))
    return found


def unresolved(directory: Path, package: Path = _PACKAGE) -> list[str]:
    """One line per citation in ``package`` whose page, or one of whose sections, is not in
    ``directory``'s pages."""
    known = pages(directory)
    texts: dict[str, str] = {}
    problems = []
    for where, line, page, numbers in citations(package):
        if page not in known:
            problems.append(f"{where}:{line}: docs/{page}.md is not among the pages")
            continue
        text = texts.setdefault(page, known[page].read_text(encoding="utf-8"))
        problems += [
            f"{where}:{line}: docs/{page}.md has no §{number}"
            for number in numbers
            if section(text, number) is None
        ]
    return problems


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="relmem docs",
        description=(
            "The documentation pages that help texts and errors cite as docs/PAGE.md §N: "
            "`relmem docs` lists them, `relmem docs PAGE` prints one, `relmem docs PAGE N` "
            "prints its section N (relmem docs tasks 3.6)."
        ),
    )
    parser.add_argument("page", nargs="?", help="a page: runs (or runs.md)")
    parser.add_argument("section", nargs="?", help="a section number: 3.6 or §3.6")
    parser.add_argument("--path", action="store_true", help="print the pages' folder instead")
    parser.add_argument(
        "--check",
        action="store_true",
        help="check that every docs/PAGE.md §N cited in relmem's sources is here; exit 1 if not",
    )
    return parser


def main(argv: list[str]) -> int:
    """``relmem docs``; returns the exit status (2 for an unknown page or section)."""
    args = _parser().parse_args(argv)
    try:
        directory = docs_directory()
    except FileNotFoundError as exc:
        print(f"relmem docs: error: {exc}", file=sys.stderr)
        return 2
    known = pages(directory)
    if args.path:
        print(directory)
        return 0
    if args.check:
        problems = unresolved(directory)
        for problem in problems:
            print(problem)
        count = len(citations())
        print(
            f"{count} citations, {len(problems)} unresolved, in {len(known)} pages at {directory}"
        )
        return 1 if problems else 0
    if args.page is None:
        width = max(map(len, known), default=0)
        print(f"Documentation pages ({directory}):\n")
        for name, path in known.items():
            print(f"  {name.ljust(width)}  {title(path)}")
        print("\n`relmem docs PAGE` prints a page, `relmem docs PAGE N` its section N.")
        return 0
    name = Path(args.page).name.removesuffix(".md")
    if name not in known:
        print(
            f"relmem docs: error: no page {args.page!r}; pages: {', '.join(known)}",
            file=sys.stderr,
        )
        return 2
    text = known[name].read_text(encoding="utf-8")
    if args.section is not None:
        number = args.section.lstrip("§").rstrip(".")
        part = section(text, number)
        if part is None:
            numbered = [m.group(2) for m in map(_HEADING.match, text.splitlines()) if m]
            print(
                f"relmem docs: error: docs/{name}.md has no section {number!r}; its sections: "
                f"{', '.join(numbered) or 'none (unnumbered page)'}",
                file=sys.stderr,
            )
            return 2
        text = part
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0
