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
# A commit hash (hex with a letter and a digit, so that 5903530 or a synset offset is not one; any
# hex in backticks) or a date (2026-11-24, 24 November 2026). A paper's "September 2020" is a
# citation, not a date.
HASH_OR_DATE = re.compile(
    r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b|`[0-9a-f]{7,40}`"
    r"|\b20[0-9]{2}-(?:0[1-9]|1[0-2])\b"
    r"|\b[0-9]{1,2} (?:January|February|March|April|May|June|July|August|September|October"
    r"|November|December) 20[0-9]{2}\b"
)


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a Markdown page's headings (lower case, punctuation dropped, spaces
    turned into hyphens) and its explicit ones (``<a id="eq-19"></a>``)."""
    text = page.read_text(encoding="utf-8")
    headings = re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE)
    explicit = set(re.findall(r"<a (?:id|name)=\"([^\"]+)\"", text))
    return explicit | {
        re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings
    }


def _broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` that lead to no file, or to a Markdown page without the
    heading their anchor names (``#anchor`` alone: a heading of ``page`` itself)."""
    broken = []
    for target in README_LINK.findall(page.read_text(encoding="utf-8")):
        if "://" in target or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path) if path else page
        if not linked.exists():
            broken.append(f"{page.relative_to(REPO)}: {target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{page.relative_to(REPO)}: {target}: no such heading")
    return broken


def test_every_relative_link_of_the_readme_resolves_to_a_file_and_its_heading() -> None:
    broken = _broken_links(README)
    assert not broken, "\n".join(broken)


def test_every_link_of_the_docs_pages_and_benchmarks_resolves_to_a_file_and_its_heading() -> None:
    """Links from a docs page to another (``stores.md#the-run-lock``), to the README and to a
    section of BENCHMARKS.md, and BENCHMARKS.md's own table of contents, reach their heading."""
    pages = [REPO / "BENCHMARKS.md", *sorted((REPO / "docs").glob("*.md"))]
    broken = [link for page in pages for link in _broken_links(page)]
    assert not broken, "\n".join(broken)


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
