"""``relmem demo``: it runs, and bad sizes end in one clear line and exit status 2."""

from __future__ import annotations

import pytest

from relmem import cli


def test_demo_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo", "--steps", "3", "--batch", "2"]) == 0
    out = capsys.readouterr().out
    assert "input (3, 2, 16) -> output (3, 2, 512), final memory (2, 4, 128)" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--batch", "0"], "--batch must be >= 1, got 0"),
        (["--mem-slots", "0"], "mem_slots must be an integer >= 1, got 0"),
    ],
)
def test_demo_refuses_bad_sizes(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["demo", *argv]) == 2
    assert message in capsys.readouterr().err
