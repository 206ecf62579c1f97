"""The pages say what is true now: no control characters in a text file, no commit or date in a
docs page, the README a front page naming only real commands. Pointers between documents are
checked in ``tests/test_docs_links.py``."""

from __future__ import annotations

import re
from pathlib import Path

from test_docs_links import tracked_files

REPO = Path(__file__).resolve().parents[1]


def test_no_text_file_holds_a_control_character() -> None:
    """A Python string that meant a LaTeX command (``"\\begin"``) writes a backspace instead of a
    backslash; Markdown shows the broken formula without a word. Tabs and newlines only."""
    control = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()!r}"
        for path in tracked_files()
        if path.suffix in {".py", ".md", ".yaml", ".sh", ".toml", ".txt"}
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if control.search(line)
    ]
    assert not found, "\n".join(found)


README = REPO / "README.md"
README_LINK = re.compile(r"\]\(([^)\s]+)\)")
# `hnce <command>` in running text, or a command line of a code block
HNCE_COMMAND = re.compile(r"(?:`|^)hnce ([a-z][a-z-]*)", re.MULTILINE)
# A commit hash (hex with a letter and a digit, so that 5903530 or a synset offset is not one; any
# hex in backticks) or a date (2026-11-24, 24 November 2026). A paper's "September 2020" is a
# citation, not a date.
HASH_OR_DATE = re.compile(
    r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b|`[0-9a-f]{7,40}`"
    r"|\b20[0-9]{2}-(?:0[1-9]|1[0-2])\b"
    r"|\b[0-9]{1,2} (?:January|February|March|April|May|June|July|August|September|October"
    r"|November|December) 20[0-9]{2}\b"
)


FENCED_BLOCK = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def test_no_docs_page_holds_a_commit_hash_or_a_date() -> None:
    """Docs pages describe the code as it is; a measured figure, with the commit and the date it
    was measured at, lives in BENCHMARKS.md. Sample output in a code block may show a timestamp."""
    found = [
        f"{page.relative_to(REPO)}: {line.strip()}"
        for page in sorted((REPO / "docs").glob("*.md"))
        for line in FENCED_BLOCK.sub("", page.read_text(encoding="utf-8")).splitlines()
        if HASH_OR_DATE.search(line)
    ]
    assert not found, "\n".join(found)


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
