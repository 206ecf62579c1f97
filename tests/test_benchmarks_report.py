"""BENCHMARKS.md is what ``python -m benchmarks.report`` assembles from ``benchmarks/results/``,
and keeps its rules: at most 600 lines, every section with its command and commit, no issue
numbers. A result file stamped by the harness carries its commit and command."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from benchmarks import report
from benchmarks.harness import results


def test_the_committed_page_is_what_the_result_files_assemble() -> None:
    committed = report.BENCHMARKS_MD.read_text(encoding="utf-8")
    assert committed == report.assemble(), (
        "BENCHMARKS.md differs from benchmarks/results/: run `.venv/bin/python -m benchmarks.report`"
    )


def test_the_committed_page_keeps_the_rules() -> None:
    assert report.problems(report.BENCHMARKS_MD.read_text(encoding="utf-8")) == []


SECTION = """## {title}

Measured at commit `abc1234`. Command: `.venv/bin/python -m benchmarks.x`.

| a | b |
|---|---|
| 1 | 2 |
"""


def test_each_rule_is_enforced() -> None:
    good = "# Benchmarks\n\n" + SECTION.format(title="A figure")
    assert report.problems(good) == []
    no_command = good.replace("Command: `.venv/bin/python -m benchmarks.x`.", "")
    no_commit = good.replace("commit `abc1234`", "some commit")
    with_issue = good.replace("A figure", "A figure (issue 27)")
    too_long = good + "\n" * report.MAX_LINES
    assert report.problems(no_command) == ['section "A figure" names no command ("Command: `...`")']
    assert report.problems(no_commit) == ['section "A figure" names no commit ("commit `abc1234`")']
    assert [p.split(":")[0] for p in report.problems(with_issue)] == [
        "line 3 cites an issue number"
    ]
    assert report.problems(too_long)[0].endswith("over 600: condense to the current figures")


def test_a_page_that_breaks_the_rules_is_not_written(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    page = tmp_path / "BENCHMARKS.md"
    monkeypatch.setattr(report, "BENCHMARKS_MD", page)
    monkeypatch.setattr(report, "assemble", lambda: "# Benchmarks\n\n## No command\n")
    with pytest.raises(ValueError, match="names no command"):
        report.update_benchmarks_md()
    assert not page.exists()


def test_a_result_file_is_stamped_with_its_commit_and_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    script = results.ROOT / "benchmarks" / "cluster_search.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--entities", "1000"])
    monkeypatch.setattr(results, "commit", lambda: "abc1234+")
    stamped = results.provenance("# Sharded search\n\nCPU only.\n")
    assert stamped == (
        "# Sharded search\n\nMeasured at commit `abc1234+`. Command: "
        "`.venv/bin/python -m benchmarks.cluster_search --entities 1000`.\n\nCPU only.\n"
    )
    assert report.problems("# B\n\n" + stamped.replace("# ", "## ", 1)) == []
    assert results.provenance(stamped) == stamped
