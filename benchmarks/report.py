"""Assemble BENCHMARKS.md from the per-benchmark result files in ``benchmarks/results/``.

Every benchmark script writes its own ``benchmarks/results/<name>.md`` (figures measured in one
run, as ratios where the machine is noisy) and then calls :func:`update_benchmarks_md`, so
BENCHMARKS.md always holds the latest figures of every benchmark. Run on its own to rebuild:

    .venv/bin/python benchmarks/report.py
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
BENCHMARKS_MD = ROOT / "BENCHMARKS.md"

# Reading order of the sections; result files not listed here follow alphabetically.
SECTION_ORDER = (
    "data_converters",
    "encoders_throughput",
    "bias",
    "cluster_search",
    "cluster_encode",
    "cluster_scale",
    "cluster_scale_1024",
    "pipeline_demo",
    "pipeline_refresh_overlap",
    "full_scale",
    "wordnet_comparison",
    "peer_sentence_transformers",
)

HEADER = """# Benchmarks

Figures measured on the development machine (2 CPU cores, 24 GiB, no GPU) unless a section says
otherwise. Each section is written by the script named in it (`benchmarks/<name>.py`, results in
`benchmarks/results/<name>.md`); `python benchmarks/report.py` reassembles this file. Timings on
a shared 2-core machine are noisy: compare the ratios measured within one run, not absolute
figures across runs.
"""


def ordered_result_files() -> list[Path]:
    files = {path.stem: path for path in RESULTS.glob("*.md")}
    ordered = [files.pop(name) for name in SECTION_ORDER if name in files]
    return ordered + [files[name] for name in sorted(files)]


_RELATIVE_LINK = re.compile(r"\]\((?![a-z]+://|/|#)([^)]+)\)")


def as_section(markdown: str) -> str:
    """One heading level down, so every result file becomes a section of BENCHMARKS.md, with its
    relative links (plots beside the result file) made relative to the repository root."""
    results = RESULTS.relative_to(ROOT).as_posix()
    lines = ("#" + line if line.startswith("#") else line for line in markdown.strip().splitlines())
    return _RELATIVE_LINK.sub(lambda link: f"]({results}/{link.group(1)})", "\n".join(lines))


def update_benchmarks_md() -> Path:
    """Rewrite BENCHMARKS.md from every result file; returns its path."""
    sections = [as_section(path.read_text(encoding="utf-8")) for path in ordered_result_files()]
    BENCHMARKS_MD.write_text("\n\n".join([HEADER.strip(), *sections]) + "\n", encoding="utf-8")
    return BENCHMARKS_MD


def write_result(output: Path, lines: list[str]) -> None:
    """Write a benchmark's result file from its markdown ``lines``, rebuild BENCHMARKS.md, print it."""
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text("\n".join(lines) + "\n", encoding="utf-8")
    update_benchmarks_md()
    print("\n".join(lines))


def write_measures(output: Path, title: str, note: str, rows: list[tuple[str, str]]) -> None:
    """Write a ``| measure | value |`` result file, rebuild BENCHMARKS.md, print the table."""
    text = [f"# {title}", "", note, "", "| measure | value |", "|---|---|"]
    write_result(output, text + [f"| {name} | {value} |" for name, value in rows])


if __name__ == "__main__":
    print(f"wrote {update_benchmarks_md()}")
