"""The repository documents itself: nothing in it points outside it, and every relative link of
the Markdown pages (README, BENCHMARKS, docs/) leads to a file that exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUTSIDE = re.compile(r"\.\./shared|DESIGN\.md|papers/00\d")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _tracked_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return [REPO / name for name in listed.stdout.splitlines() if (REPO / name).is_file()]


def test_nothing_in_the_repository_points_outside_it() -> None:
    this_file = Path(__file__).resolve()
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in _tracked_files()
        if path.suffix in {".py", ".md", ".yaml", ".sh", ".toml"} and path != this_file
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not found, "\n".join(found)


def test_every_relative_link_of_the_docs_resolves() -> None:
    pages = [REPO / "README.md", REPO / "BENCHMARKS.md", *sorted((REPO / "docs").glob("*.md"))]
    broken = [
        f"{page.relative_to(REPO)}: {target}"
        for page in pages
        for target in LINK.findall(page.read_text(encoding="utf-8"))
        if "://" not in target and not (page.parent / target).exists()
    ]
    assert (REPO / "docs" / "README.md").is_file()
    assert not broken, "\n".join(broken)


def test_no_text_file_holds_a_control_character() -> None:
    """A Python string that meant a LaTeX command (``"\\begin"``) writes a backspace instead of a
    backslash; Markdown shows the broken formula without a word. Tabs and newlines only."""
    control = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()!r}"
        for path in _tracked_files()
        if path.suffix in {".py", ".md", ".yaml", ".sh", ".toml", ".txt"}
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if control.search(line)
    ]
    assert not found, "\n".join(found)
