"""Progress is decided once per process: a bar on a terminal, log lines elsewhere, nothing when
quiet; nothing threads a flag through the calls."""

from __future__ import annotations

import ast
import io
import logging
from pathlib import Path

import pytest

from hnce import progress
from hnce.progress import progress_bar, quiet


def test_off_a_terminal_progress_is_log_lines_not_a_redrawn_bar(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(progress, "_shown", True)
    monkeypatch.setattr("sys.stderr", io.StringIO())
    with caplog.at_level(logging.INFO, logger="hnce.progress"):
        for _ in progress_bar(range(1000), desc="encode", unit="entities"):
            pass
    lines = [record.getMessage() for record in caplog.records]
    assert lines and all("\r" not in line for line in lines)
    assert lines[-1].startswith("encode: 1000/1000 entities")
    assert len(lines) <= 2  # the first line and the last, not one per update


def test_quiet_silences_every_bar_of_the_process_and_nests(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(progress, "_shown", True)
    monkeypatch.setattr("sys.stderr", io.StringIO())
    with caplog.at_level(logging.INFO, logger="hnce.progress"):
        with quiet():
            with quiet(False):  # an inner "not quiet" does not undo an outer quiet
                assert progress_bar(range(3), desc="inner").disable
            list(progress_bar(range(3), desc="silent"))
        assert not progress_bar(range(3), desc="after").disable
    assert not [r for r in caplog.records if "silent" in r.getMessage()]


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--no-progress"],
        ["data", "synthetic-kilt", "--out", "x", "--no-progress"],
        ["data", "--quiet", "kilt", "--knowledge-source", "k", "--out", "x"],
    ],
)
def test_every_command_and_subcommand_takes_no_progress(argv: list[str]) -> None:
    from hnce.pipeline.cli.main import build_parser

    assert build_parser(argv[0]).parse_args(argv).no_progress is True
    without = [word for word in argv if word not in ("--no-progress", "--quiet")]
    assert not hasattr(build_parser(argv[0]).parse_args(without), "no_progress")


def test_every_bar_in_the_package_goes_through_progress_bar() -> None:
    """A bare ``tqdm(...)`` ignores ``--no-progress`` and redraws a bar into log files; every
    loop must make its bar with :func:`progress_bar` (only ``hnce.progress`` builds one)."""
    repo = Path(__file__).resolve().parents[1]
    own = repo / "hnce" / "progress.py"
    found = []
    for layer in ("encoders", "mining", "cluster", "pipeline", "hnce"):
        for path in (repo / layer).rglob("*.py"):
            if path == own:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.Call):
                    continue
                called = node.func.attr if isinstance(node.func, ast.Attribute) else None
                called = node.func.id if isinstance(node.func, ast.Name) else called
                if called in ("tqdm", "trange"):
                    found.append(f"{path.relative_to(repo)}:{node.lineno}: {called}(...)")
    assert not found, "\n".join(found)
