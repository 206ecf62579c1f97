"""The figures every evaluation reports, shown and written one way (``hnce eval``, the demo, the
reranker, the benchmarks).

The recall itself is computed by ``hnce.cluster.compute.recall`` (the refresh scores its held-out
recall with it too, below the pipeline); this module prints reports as plain-text tables
(:func:`text_table`, :func:`format_table`) and writes them as JSON.

Example::

    report = recall_report("trained", candidates, mentions, ks=[1, 64], num_entities=N)
    print(format_table([report]))
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hnce.cluster.compute.recall import RecallReport
from hnce.cluster.stores.files import atomic_write_json


def column_widths(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[int]:
    """Each column's widest cell, header included: what :func:`text_table` pads to, so a caller
    fitting a last column into a width knows what the others take."""
    return [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table with a rule under its header, columns padded to their widest cell."""
    widths = column_widths(headers, rows)
    lines = [
        " | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in [headers, *rows]
    ]
    lines.insert(1, "-+-".join("-" * width for width in widths))
    return "\n".join(lines)


def write_json_report(path: Path, payload: Any) -> Path:
    """A report as indented JSON, replaced atomically."""
    return atomic_write_json(path, payload)


def format_table(reports: Sequence[RecallReport], ks: Sequence[int] | None = None) -> str:
    """One row per report: mentions, entities, micro recall@k and macro accuracy; then, where
    the report tells them apart, a row each for the mentions of seen and unseen entities."""
    ks = list(ks or sorted(reports[0].recall)) if reports else []
    headers = ["model", "mentions", "entities", *[f"R@{k}" for k in ks], "macro acc"]
    rows = []
    for report in reports:
        rows.append(
            [
                report.name,
                str(report.num_mentions),
                str(report.num_entities),
                *[f"{report.recall[k]:.3f}" for k in ks],
                f"{report.macro_accuracy:.3f}",
            ]
        )
        for exposure, figures in report.per_exposure.items():
            rows.append(
                [
                    f"  {exposure} entities",
                    str(int(figures["mentions"])),
                    "",
                    *[f"{figures[f'recall@{k}']:.3f}" for k in ks],
                    "",
                ]
            )
    return text_table(headers, rows)


def write_reports(reports: Sequence[RecallReport], path: Path) -> Path:
    """JSON: a list of reports (micro, macro and per-domain figures)."""
    return write_json_report(path, [report.to_json() for report in reports])
