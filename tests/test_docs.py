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


README = REPO / "README.md"
README_LINK = re.compile(r"\]\(([^)\s]+)\)")
# `hnce <command>` in running text, or a command line of a code block
HNCE_COMMAND = re.compile(r"(?:`|^)hnce ([a-z][a-z-]*)", re.MULTILINE)
HASH_OR_DATE = re.compile(r"\b[0-9a-f]{7,40}\b|20[0-9]{2}-[0-9]{2}")


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a Markdown page's headings: lower case, punctuation dropped, spaces
    turned into hyphens."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_every_relative_link_of_the_readme_resolves_to_a_file_and_its_heading() -> None:
    broken = []
    for target in README_LINK.findall(README.read_text(encoding="utf-8")):
        if "://" in target:
            continue
        path, _, anchor = target.partition("#")
        page = (REPO / path) if path else README
        if not page.exists():
            broken.append(f"{target}: no such file")
        elif anchor and anchor not in _anchors(page):
            broken.append(f"{target}: no such heading")
    assert not broken, "\n".join(broken)


def test_every_docs_page_is_linked_from_the_readme_or_the_docs_index() -> None:
    linking = README.read_text(encoding="utf-8") + (REPO / "docs" / "README.md").read_text(
        encoding="utf-8"
    )
    linked = {Path(target.partition("#")[0]).name for target in README_LINK.findall(linking)}
    unlinked = [
        page.name
        for page in sorted((REPO / "docs").glob("*.md"))
        if page.name != "README.md" and page.name not in linked
    ]
    assert not unlinked, unlinked


def test_every_command_the_readme_names_is_a_subcommand_of_the_cli() -> None:
    from hnce.pipeline.cli.main import build_parser

    parser = build_parser()
    subcommands = next(
        action.choices
        for action in parser._actions
        if hasattr(action, "choices") and action.choices
    )
    named = set(HNCE_COMMAND.findall(README.read_text(encoding="utf-8")))
    assert named, "the README names no command"
    assert named <= set(subcommands), sorted(named - set(subcommands))


def test_the_readme_is_a_front_page() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines"
    assert lines[2:6] == [
        "```bash",
        "bash scripts/demo.sh    # set-up (venv, pinned CPU torch, Debian WordNet) + the main job end to end",
        'bash scripts/test.sh    # set-up + the whole test suite (add -m "not slow" for the quick part)',
        "```",
    ]
    dated = [line for line in lines if HASH_OR_DATE.search(line)]
    assert not dated, "\n".join(dated)
