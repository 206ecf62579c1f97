"""Result files, written atomically.

Every benchmark writes its own ``benchmarks/results/<name>.md`` (figures measured in one run, as
ratios where the machine is noisy; plots and raw JSON beside it) through :func:`write_result`,
:func:`write_measures` or :func:`write_json`. Each write goes through a temporary sibling renamed
over the target (``hnce.cluster.stores.files``), so a reader or an interrupted run never sees a
half-written file. A result that lands in ``benchmarks/results/`` carries the commit and the
command it was measured with (:func:`provenance`), and BENCHMARKS.md is rebuilt from those
files (``benchmarks.report``; run it by hand after editing a result file). A result written
elsewhere (``--output``, ``--output-dir``: small runs, trials) is not part of it.

Example::

    write_measures(args.output, "Sharded search", "CPU only, one run.", [("QPS", "812.4")])

    with plot(args.output.with_suffix(".png"), figsize=(6, 4)) as (figure, axis):
        axis.plot(steps, recall)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hnce.cluster.stores.files import AtomicPath, atomic_write_text

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"

COMMIT_LINE = re.compile(r"\bcommits? `[0-9a-f]{7,40}\+?`")
COMMAND_LINE = re.compile(r"Commands?:\s*`")


def commit() -> str:
    """The repository's commit, with ``+`` when the work tree has changes."""
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    return head + ("+" if dirty else "")


def running_command() -> str | None:
    """The command line of the benchmark this process runs (``python -m benchmarks.<name>
    ...``), or None when it is not one."""
    script = Path(sys.argv[0]).resolve()
    if not script.is_relative_to(ROOT / "benchmarks") or script.suffix != ".py":
        return None
    module = ".".join(script.relative_to(ROOT).with_suffix("").parts)
    return " ".join([f".venv/bin/python -m {module}", *sys.argv[1:]])


def provenance(text: str) -> str:
    """``text`` with the commit it was measured at and the command that measured it, each added
    under its title where the benchmark did not write it (BENCHMARKS.md requires both)."""
    added = []
    if not COMMIT_LINE.search(text):
        added.append(f"Measured at commit `{commit()}`.")
    command = running_command()
    if not COMMAND_LINE.search(text) and command is not None:
        added.append(f"Command: `{command}`.")
    if not added:
        return text
    title, _, rest = text.partition("\n")
    return f"{title}\n\n{' '.join(added)}\n{rest}"


def in_results(path: Path) -> bool:
    """Whether ``path`` is one of the committed result files (so BENCHMARKS.md shows it)."""
    return Path(path).resolve().parent == RESULTS


def write_text(output: Path, text: str, echo: bool = False) -> Path:
    """Write a result file's ``text`` atomically (in ``benchmarks/results/``, with its commit and
    command: :func:`provenance`, and BENCHMARKS.md rebuilt from it unless the page would break its
    rules, which are then printed), print the text when ``echo``."""
    if in_results(output):
        text = provenance(text)
    atomic_write_text(output, text)
    if in_results(output):
        # imported here: the report builds the page from this module's files
        from benchmarks.report import update_benchmarks_md

        try:
            print(f"{output} written; {update_benchmarks_md()} rebuilt")
        except ValueError as refused:  # the figure is kept; the page waits for its rules
            print(f"{output} written; {refused}")
    if echo:
        print(text, end="")
    return output


def write_result(output: Path, lines: list[str]) -> Path:
    """Write a benchmark's result file from its markdown ``lines`` (:func:`write_text`), print
    it."""
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
