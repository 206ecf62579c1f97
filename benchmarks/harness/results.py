"""Result files and BENCHMARKS.md, written atomically.

Every benchmark writes its own ``benchmarks/results/<name>.md`` (figures measured in one run, as
ratios where the machine is noisy; plots and raw JSON beside it) through :func:`write_result`,
:func:`write_measures` or :func:`write_json`. Each write goes through a temporary sibling renamed
over the target (``hnce.cluster.stores.files``), so a reader or an interrupted run never sees a
half-written file. When a result lands in ``benchmarks/results/`` BENCHMARKS.md is rebuilt from
every result file there (:func:`update_benchmarks_md`); a result written elsewhere (``--output``,
``--output-dir``: small runs, trials) leaves BENCHMARKS.md alone.

Example::

    write_measures(args.output, "Sharded search", "CPU only, one run.", [("QPS", "812.4")])

    with plot(args.output.with_suffix(".png"), figsize=(6, 4)) as (figure, axis):
        axis.plot(steps, recall)
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hnce.cluster.stores.files import AtomicPath, atomic_write_text

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
BENCHMARKS_MD = ROOT / "BENCHMARKS.md"

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
            ("cluster_scale", "5.9M index, 128-d"),
            ("cluster_scale_1024", "1024-d"),
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
            ("pipeline_refresh_overlap", "trainer beside a refresh"),
            ("core_handover", "core hand-over"),
            ("subnormal_flush", "subnormal floats"),
            ("punctuation_skip", "punctuation skiplist"),
            ("link_throughput", "linking"),
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

HEADER = """# Benchmarks

Figures measured on the development machine (2 CPU cores, 24 GiB, no GPU) unless a section says
otherwise. Each section names the command that reproduces it and the commit it was measured at;
it is the current figure of its question (older runs are in git). Each section is written by its
script (`benchmarks/<name>.py`, run as `python -m benchmarks.<name>`, results in
`benchmarks/results/<name>.md`); `python -m benchmarks.report` reassembles this file. Timings on
a shared 2-core machine are noisy: compare the ratios measured within one run, not absolute
figures across runs.
"""

_RELATIVE_LINK = re.compile(r"\]\((?![a-z]+://|/|#)([^)]+)\)")


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


def update_benchmarks_md() -> Path:
    """Rewrite BENCHMARKS.md (atomically) from every result file, a table of contents first;
    returns its path."""
    files = ordered_result_files()
    sections = [as_section(path.read_text(encoding="utf-8")) for path in files]
    parts = [HEADER.strip(), table_of_contents(files), *sections]
    return atomic_write_text(BENCHMARKS_MD, "\n\n".join(parts) + "\n")


def in_results(path: Path) -> bool:
    """Whether ``path`` is one of the committed result files (so BENCHMARKS.md shows it)."""
    return Path(path).resolve().parent == RESULTS


def write_text(output: Path, text: str, echo: bool = False) -> Path:
    """Write a result file's ``text`` atomically, rebuild BENCHMARKS.md when the file is in
    ``benchmarks/results/``, print the text when ``echo``."""
    atomic_write_text(output, text)
    if in_results(output):
        update_benchmarks_md()
    if echo:
        print(text, end="")
    return output


def write_result(output: Path, lines: list[str]) -> Path:
    """Write a benchmark's result file from its markdown ``lines``, rebuild BENCHMARKS.md (when
    ``output`` is in ``benchmarks/results/``), print it."""
    return write_text(output, "\n".join(lines) + "\n", echo=True)


def write_measures(output: Path, title: str, note: str, rows: list[tuple[str, str]]) -> Path:
    """Write a ``| measure | value |`` result file (:func:`write_result`)."""
    text = [f"# {title}", "", note, "", "| measure | value |", "|---|---|"]
    return write_result(output, text + [f"| {name} | {value} |" for name, value in rows])


def write_json(path: Path, payload: Any) -> Path:
    """Raw figures beside a result file, as indented JSON (keys in the order given), atomically."""
    return atomic_write_text(path, json.dumps(payload, indent=2) + "\n")


@contextmanager
def plot(path: Path, **subplots: Any) -> Iterator[tuple[Any, Any]]:
    """A matplotlib figure and its axes (``plt.subplots(**subplots)``, no display needed), laid
    out tight and written to ``path`` as PNG (120 dpi, atomically) when the block ends."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(**subplots)
    try:
        yield figure, axes
        figure.tight_layout()
        with AtomicPath(path) as temporary:
            figure.savefig(temporary, dpi=120, format="png")
    finally:
        plt.close(figure)
