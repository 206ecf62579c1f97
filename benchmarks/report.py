"""BENCHMARKS.md, assembled from the result files in ``benchmarks/results/`` and held to its rules.

Every benchmark writes its own ``benchmarks/results/<name>.md``; this module puts them in one
page, a table of contents first, each result file a section (its headings one level down, its
links made relative to the repository root). The page holds one current figure per question
(older runs are in git), so it is refused, with every reason, when:

- it is longer than :data:`MAX_LINES` lines (condense a result file: the current figure only);
- a section names no command (``Command: `...```) or no commit (``commit `abc1234```) it was
  measured at;
- it cites an issue number (``issue 27``): a heading says what is measured, not why it was.

Run it after writing or editing a result file (``tests/test_benchmarks_report.py`` checks that
the committed page is what it assembles, and that it keeps the rules)::

    .venv/bin/python -m benchmarks.report
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from benchmarks.harness.results import RESULTS, ROOT
from hnce.cluster.stores.files import atomic_write_text

BENCHMARKS_MD = ROOT / "BENCHMARKS.md"
MAX_LINES = 600

# Reading order of the sections, grouped by the question they answer: (group, ((result file,
# its name in the table of contents), ...)). Result files not listed here follow alphabetically,
# under "Other".
SECTIONS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    (
        "The demo",
        (
            ("pipeline_demo", "what it prints"),
            ("demo_errors", "where R@1 is lost"),
            ("demo_negatives_ceiling", "the best possible negatives"),
        ),
    ),
    (
        "Against the peer",
        (
            ("peer_sentence_transformers", "sentence-transformers"),
            ("step_parity", "the training step"),
            ("first_step", "time to the first step"),
        ),
    ),
    (
        "Recipes and negatives",
        (
            ("yardstick", "the yardstick: seen and unseen entities"),
            ("wordnet_comparison", "scorers x negatives"),
            ("bias", "gradient bias"),
            ("real_model_bias", "gradient bias while training"),
        ),
    ),
    (
        "Scale",
        (
            ("full_scale", "5.9M entities"),
            ("full_scale_20000_som", "sum-of-max path"),
            ("cluster_scale", "5.9M index, 128-d and 1024-d"),
            ("token_index", "compressed multi-vector indexes"),
            ("plaid_index", "plaid token index"),
            ("exact_mining", "exact mining"),
            ("checkpoint_disk", "checkpoints on disk"),
        ),
    ),
    (
        "Throughput on CPUs",
        (
            ("data_converters", "converters"),
            ("encoders_throughput", "encoders"),
            ("cluster_search", "sharded search"),
            ("cluster_encode", "refresh encoding"),
            ("encode_cores", "encoding on every core"),
            ("kept_pool", "kept encoder pool"),
            ("heldout_recall_cost", "held-out recall"),
            ("core_handover", "core hand-over"),
            ("subnormal_flush", "subnormal floats"),
            ("punctuation_skip", "punctuation skiplist"),
            ("link_throughput", "linking"),
            ("link_load", "linking under load"),
        ),
    ),
    (
        "GPUs",
        (
            ("gpu_paths", "GPU paths"),
            ("gpu_multivector", "multi-vector scorers"),
        ),
    ),
)
SECTION_ORDER = tuple(name for _, names in SECTIONS for name, _ in names)

HEADER = (
    "# Benchmarks\n\n"
    "Figures measured on the development machine (2 CPU cores, 24 GiB, no GPU) unless a section "
    "says otherwise. Each section is the current figure of its question (older runs are in git), "
    "with the command that reproduces it and the commit it was measured at; each is written by "
    "its script (`python -m benchmarks.<name>`, results in `benchmarks/results/<name>.md`), and "
    "`python -m benchmarks.report` reassembles this file. Timings on a shared 2-core machine are "
    "noisy: compare the ratios measured within one run, not absolute figures across runs.\n"
)

_RELATIVE_LINK = re.compile(r"\]\((?![a-z]+://|/|#)([^)]+)\)")
COMMAND = re.compile(r"Commands?:\s*`[^`]+`")
COMMIT = re.compile(r"\bcommits? `[0-9a-f]{7,40}\+?`")
ISSUE = re.compile(r"\bissues?[\s-]+#?\d+", re.IGNORECASE)


def ordered_result_files() -> list[Path]:
    """The result files of ``benchmarks/results/`` in BENCHMARKS.md's reading order."""
    files = {path.stem: path for path in RESULTS.glob("*.md")}
    ordered = [files.pop(name) for name in SECTION_ORDER if name in files]
    return ordered + [files[name] for name in sorted(files)]


def as_section(markdown: str) -> str:
    """One heading level down, so every result file becomes a section of BENCHMARKS.md, with its
    relative links (plots beside the result file) made relative to the repository root."""
    results = RESULTS.relative_to(ROOT).as_posix()
    lines = ("#" + line if line.startswith("#") else line for line in markdown.strip().splitlines())
    return _RELATIVE_LINK.sub(lambda link: f"]({results}/{link.group(1)})", "\n".join(lines))


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces turned into
    hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def table_of_contents(files: list[Path]) -> str:
    """One line per group of :data:`SECTIONS`, each section linked by its short name; result
    files outside it under "Other", by their title."""
    titles = {}
    for path in files:
        first = path.read_text(encoding="utf-8").lstrip().splitlines()[0]
        titles[path.stem] = first.lstrip("#").strip()
    groups = [
        (group, [(name, label) for name, label in names if name in titles])
        for group, names in SECTIONS
    ]
    listed = set(SECTION_ORDER)
    groups.append(("Other", [(name, titles[name]) for name in titles if name not in listed]))
    lines = [
        f"- **{group}**: "
        + ", ".join(f"[{label}](#{anchor(titles[name])})" for name, label in entries)
        for group, entries in groups
        if entries
    ]
    return "Contents:\n\n" + "\n".join(lines)


def assemble() -> str:
    """BENCHMARKS.md's text from every result file, a table of contents first."""
    files = ordered_result_files()
    sections = [as_section(path.read_text(encoding="utf-8")) for path in files]
    return "\n\n".join([HEADER.strip(), table_of_contents(files), *sections]) + "\n"


def problems(text: str) -> list[str]:
    """Why ``text`` breaks BENCHMARKS.md's rules (module docs); empty when it keeps them."""
    found = []
    lines = text.splitlines()
    if len(lines) > MAX_LINES:
        found.append(f"{len(lines)} lines, over {MAX_LINES}: condense to the current figures")
    for number, line in enumerate(lines, 1):
        if ISSUE.search(line):
            found.append(f"line {number} cites an issue number: {line.strip()[:100]}")
    sections = re.split(r"^(?=## )", text, flags=re.MULTILINE)[1:]
    for section in sections:
        title = section.splitlines()[0][3:]
        flat = " ".join(section.split())
        if not COMMAND.search(flat):
            found.append(f'section "{title}" names no command ("Command: `...`")')
        if not COMMIT.search(flat):
            found.append(f'section "{title}" names no commit ("commit `abc1234`")')
    return found


def update_benchmarks_md() -> Path:
    """Rewrite BENCHMARKS.md (atomically) from the result files; a ``ValueError`` with every
    reason, and the page left as it was, when the result would break the rules."""
    text = assemble()
    found = problems(text)
    if found:
        raise ValueError("BENCHMARKS.md not written:\n- " + "\n- ".join(found))
    return atomic_write_text(BENCHMARKS_MD, text)


def main() -> None:
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    try:
        print(f"wrote {update_benchmarks_md()}")
    except ValueError as refused:
        sys.exit(str(refused))


if __name__ == "__main__":
    main()
