"""Every pointer into the documents resolves, and nothing points outside the repository.

A pointer is a Markdown link (``[x](docs/y.md#anchor)``, in any Markdown file), a page named in
text (``docs/refresh.md``, ``docs/papers.md#zhang-stratos-2021``), a page and one of its sections
(``docs/refresh.md, "The run lock"``; ``README, "Tests"``; ``BENCHMARKS.md, "GPU paths"``; the
README's "Commands" section), or an equation of docs/math.md (``eq. (59)``, ``eqs. (56)–(58)``,
``docs/math.md eq. 20``). Configs, docstrings, comments and pages are all read: a pointer that
drifts from the page it names fails here, with the file that holds it.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MATH = REPO / "docs" / "math.md"
TEXT = {".py", ".md", ".yaml", ".sh", ".toml", ".txt", ".cfg"}
OUTSIDE = re.compile(r"\.\./shared|DESIGN\.md|papers/00\d")
LINK = re.compile(r"\]\(([^)\s]+)\)")
# a page named in text (a Markdown link's target is checked as a link)
PAGE = r"(?<![\w/.-])(?<!\]\()(?P<page>README(?:\.md)?|BENCHMARKS(?:\.md)?|(?:docs/)?[\w-]+\.md)"
# docs/x.md#anchor in running text (a template such as #eq-N or #<anchor> is not a pointer)
PAGE_ANCHOR = re.compile(PAGE + r"#(?P<anchor>[a-z0-9][a-z0-9_-]*[a-z0-9])(?![\w<>-])")
# a page and a section heading it names: `page, "Heading"`, `page "Heading"`, `page's "Heading"`,
# `page, 'Heading'`
PAGE_SECTION = re.compile(
    PAGE + r"(?:'s)?(?:,\s*|\s+)(?:section\s+)?(?:[\"“](?P<double>[^\"”\n]{2,80})[\"”]"
    r"|'(?P<single>[A-Z][^'\n]{1,80})')"
)
EQUATION = re.compile(
    r"\beqs?\.\s*\((?P<first>\d+)\)(?:\s*(?:–|-|to|and|,)\s*\((?P<last>\d+)\))?"
    r"|math\.md,?\s+eqs?\.?\s+(?P<bare>\d+)\b"
)


def tracked_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return [REPO / name for name in listed.stdout.splitlines() if (REPO / name).is_file()]


def text_files() -> list[Path]:
    """Every text file a pointer may sit in, this test aside (it spells examples)."""
    this = Path(__file__).resolve()
    return [path for path in tracked_files() if path.suffix in TEXT and path != this]


def _plain(heading: str) -> str:
    """A heading as words: lower case, Markdown marks and a leading number ("3. ") dropped."""
    heading = re.sub(r"[`*_]", "", heading.lower())
    heading = re.sub(r"^\d+(?:\.\d+)*\.?\s+", "", heading.strip())
    return " ".join(re.findall(r"[\w@.'-]+", heading))


@cache
def headings(page: Path) -> tuple[str, ...]:
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    return tuple(re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE))


@cache
def anchors(page: Path) -> frozenset[str]:
    """GitHub's anchors of a Markdown page's headings (lower case, punctuation dropped, spaces
    turned into hyphens) and its explicit ones (``<a id="eq-19"></a>``)."""
    explicit = set(re.findall(r"<a (?:id|name)=\"([^\"]+)\"", page.read_text(encoding="utf-8")))
    return frozenset(
        explicit
        | {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings(page)}
    )


def names_a_heading(page: Path, section: str) -> bool:
    """Whether ``section``'s words, in order, are a heading of ``page`` or part of one."""
    wanted = f" {_plain(section)} "
    return any(wanted in f" {_plain(heading)} " for heading in headings(page))


def resolve(page: str, holder: Path, root: Path = REPO) -> Path | None:
    """The file a page name in ``holder`` means: README and BENCHMARKS are the repository's own;
    ``docs/x.md`` is from the root; a bare ``x.md`` is beside ``holder`` or in docs/."""
    if page.startswith(("README", "BENCHMARKS")):
        return root / (page if page.endswith(".md") else f"{page}.md")
    if page.startswith("docs/"):
        return root / page
    for folder in (holder.parent, root / "docs"):
        if (folder / page).is_file():
            return folder / page
    return None


@cache
def math_equations(math: Path = MATH) -> frozenset[str]:
    return frozenset(re.findall(r"<a id=\"eq-(\d+)\"", math.read_text(encoding="utf-8")))


def _flat(path: Path) -> str:
    """The file's text with line breaks (and a comment's or docstring's indent) as spaces, so a
    pointer wrapped over two lines reads as one."""
    return re.sub(r"[ \t]*\n[ \t]*(?:#:?[ \t]*)?", " ", path.read_text(encoding="utf-8"))


def broken_pointers(path: Path, root: Path = REPO) -> list[str]:
    """The prose pointers of ``path`` that lead nowhere: a page that does not exist, an anchor or
    a section heading it lacks, an equation docs/math.md does not number."""
    text = _flat(path)
    where = path.relative_to(root).as_posix()
    broken = []
    for found in PAGE_ANCHOR.finditer(text):
        page = resolve(found["page"], path, root)
        if page is None or not page.is_file():
            broken.append(f"{where}: {found[0]}: no such page")
        elif found["anchor"] not in anchors(page):
            broken.append(f"{where}: {found[0]}: no such anchor")
    for found in PAGE_SECTION.finditer(text):
        page = resolve(found["page"], path, root)
        section = found["double"] or found["single"]
        if page is None or not page.is_file():
            broken.append(f"{where}: {found[0]}: no such page")
        elif not names_a_heading(page, section):
            broken.append(f"{where}: {found[0]}: {page.name} has no such section")
    for found in re.finditer(r"(?<![\w/.-])docs/[\w-]+\.md\b", text):
        if not (root / found[0]).is_file():
            broken.append(f"{where}: {found[0]}: no such page")
    for found in EQUATION.finditer(text):
        for number in (found["first"], found["last"], found["bare"]):
            if number is not None and number not in math_equations(root / "docs" / "math.md"):
                broken.append(f"{where}: {found[0]}: docs/math.md has no eq. ({number})")
    return broken


def broken_links(page: Path, root: Path = REPO) -> list[str]:
    """The relative links of a Markdown page that lead to no file in the repository, or to a
    Markdown page without the heading their anchor names (``#anchor`` alone: ``page``'s own)."""
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if "://" in target or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(root)}: {target}"
        if not linked.is_relative_to(root):
            broken.append(f"{where}: outside the repository")
        elif not linked.exists():
            broken.append(f"{where}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{where}: no such heading")
    return broken


def test_every_link_of_every_markdown_file_resolves_to_a_file_and_its_heading() -> None:
    """A result file's links are checked where they are read, as a section of BENCHMARKS.md."""
    results = REPO / "benchmarks" / "results"
    pages = [path for path in tracked_files() if path.suffix == ".md" and path.parent != results]
    assert REPO / "README.md" in pages and REPO / "docs" / "README.md" in pages
    broken = [link for page in pages for link in broken_links(page)]
    assert not broken, "\n".join(broken)


def test_every_page_section_and_equation_named_in_text_exists() -> None:
    broken = [pointer for path in text_files() for pointer in broken_pointers(path)]
    assert not broken, "\n".join(broken)


def test_nothing_in_the_repository_points_outside_it() -> None:
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in text_files()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not found, "\n".join(found)


def test_the_checks_find_each_kind_of_broken_pointer(tmp_path: Path) -> None:
    """Each pointer form, once resolving and once not, in a small repository of its own."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# Front\n\n## Commands\n")
    (tmp_path / "docs" / "refresh.md").write_text("# Refresh\n\n## The run lock\n")
    (tmp_path / "docs" / "papers.md").write_text('<a id="zhang-stratos-2021"></a>\n')
    (tmp_path / "docs" / "math.md").write_text(
        "".join(f'<a id="eq-{n}"></a>({n})\n' for n in (1, 20, 56, 57, 58, 59))
    )
    probe = tmp_path / "docs" / "probe.md"
    probe.write_text(
        "\n".join(
            [
                "# Probe",
                "[ok](refresh.md#the-run-lock) [bad](refresh.md#no-such) [gone](nowhere.md)",
                "[out](../../elsewhere.md) [self](#probe) [bad self](#no-such-heading)",
                'docs/refresh.md, "The run lock"; docs/refresh.md, "The lock of nothing";',
                "README's \"Commands\" section; README, 'Nothing here'; docs/missing.md;",
                "docs/papers.md#zhang-stratos-2021; docs/papers.md#no-such-paper;",
                "eq. (59), eqs. (56)–(58), eq. (999), docs/math.md eq. 20, eqs. (1)–(998).",
                "A template: math.md#eq-N, docs/papers.md#<anchor>.",
            ]
        )
    )
    links = broken_links(probe, tmp_path)
    assert [line.split(": ")[1] for line in links] == [
        "refresh.md#no-such",
        "nowhere.md",
        "../../elsewhere.md",
        "#no-such-heading",
    ]
    assert links[2].endswith("outside the repository")
    pointers = broken_pointers(probe, tmp_path)
    assert sorted(line.split(": ")[1] for line in pointers) == sorted(
        [
            "docs/papers.md#no-such-paper",
            'docs/refresh.md, "The lock of nothing"',
            "README, 'Nothing here'",
            "docs/missing.md",
            "eq. (999)",
            "eqs. (1)–(998)",
        ]
    )
