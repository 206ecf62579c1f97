"""The figures every evaluation reports, computed and shown one way (``hnce eval``, the demo, the
reranker, the benchmarks).

A ranked candidate list per mention goes in; what comes out is, per mention, the rank of its
first correct entity (:func:`first_correct_rank`: a mention may have several correct entities,
``golds``; one whose gold is missing from the catalogue has none and counts as an error). Reports
aggregate those ranks micro (over mentions), per domain and macro (the mean of the per-domain
figures: Zeshel's macro-averaged accuracy), and print as plain-text tables (:func:`text_table`).

Example::

    ranks = first_correct_rank(candidates, [m.golds for m in mentions])
    report = summarise("trained", ranks, [m.domain for m in mentions], ks=[1, 64], num_entities=N)
    print(format_table([report]))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hnce.cluster.stores.files import atomic_write_json

#: The rank of a mention none of whose candidates is correct.
NOT_FOUND = np.iinfo(np.int64).max


def correct_sets(golds: Sequence[Sequence[int]]) -> list[set[int]]:
    """The correct entity ids of each mention; empty when its gold is missing (id < 0)."""
    return [{int(g) for g in correct if g >= 0} for correct in golds]


def first_correct_rank(candidates: np.ndarray, golds: Sequence[Sequence[int]]) -> np.ndarray:
    """int64 [M]: the position of row i's first correct candidate, :data:`NOT_FOUND` if none."""
    ranks = np.full(len(golds), NOT_FOUND, dtype=np.int64)
    for row, correct in enumerate(correct_sets(golds)):
        positions = np.flatnonzero(np.isin(candidates[row], np.fromiter(correct, np.int64)))
        if positions.size:
            ranks[row] = positions[0]
    return ranks


def hits_at(
    candidates: np.ndarray, golds: Sequence[Sequence[int]], ks: Sequence[int]
) -> np.ndarray:
    """Bool [M, len(ks)]: does row i hold a correct entity among its first k candidates?"""
    ranks = first_correct_rank(candidates, golds)
    return np.stack([ranks < k for k in ks], axis=1)


def by_domain(domains: Sequence[str]) -> dict[str, np.ndarray]:
    """Row indices of each domain, domains in sorted order."""
    domain_array = np.asarray(domains)
    return {domain: np.flatnonzero(domain_array == domain) for domain in sorted(set(domains))}


def macro_average(
    per_domain: Mapping[str, Any], figure: Callable[[Any], float], names: Sequence[str]
) -> dict[str, float]:
    """The mean over domains of each named figure (``figure(domain_value, name)``)."""
    values = list(per_domain.values())
    return {
        name: float(np.mean([figure(value, name) for value in values])) if values else 0.0
        for name in names
    }


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table with a rule under its header, columns padded to their widest cell."""
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]
    lines = [
        " | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in [headers, *rows]
    ]
    lines.insert(1, "-+-".join("-" * width for width in widths))
    return "\n".join(lines)


def write_json_report(path: Path, payload: Any) -> Path:
    """A report as indented JSON, replaced atomically."""
    return atomic_write_json(path, payload)


@dataclass
class RecallReport:
    """Recall@k micro (over mentions) and macro (over domains), with per-domain figures."""

    name: str
    num_mentions: int
    num_entities: int
    recall: dict[int, float]
    macro_recall: dict[int, float]
    per_domain: dict[str, dict[str, float]] = field(default_factory=dict)
    index: str = ""  # the index version searched

    @property
    def accuracy(self) -> float:
        return self.recall[1] if 1 in self.recall else float("nan")

    @property
    def macro_accuracy(self) -> float:
        return self.macro_recall[1] if 1 in self.macro_recall else float("nan")

    def to_json(self) -> dict[str, object]:
        payload = asdict(self)
        payload["accuracy"] = self.accuracy
        payload["macro_accuracy"] = self.macro_accuracy
        return payload


def summarise(
    name: str,
    hits: np.ndarray,
    domains: Sequence[str],
    ks: Sequence[int],
    num_entities: int,
) -> RecallReport:
    """Micro and macro (over domains) recall from a hit matrix (:func:`hits_at`)."""
    recall = {k: float(hits[:, j].mean()) if len(hits) else 0.0 for j, k in enumerate(ks)}
    per_domain: dict[str, dict[str, float]] = {}
    for domain, rows in by_domain(domains).items():
        per_domain[domain] = {"mentions": float(len(rows))}
        per_domain[domain].update(
            {f"recall@{k}": float(hits[rows, j].mean()) for j, k in enumerate(ks)}
        )
    macro = macro_average(per_domain, lambda figures, k: figures[f"recall@{k}"], ks)
    return RecallReport(name, len(hits), num_entities, recall, macro, per_domain)


def format_table(reports: Sequence[RecallReport], ks: Sequence[int] | None = None) -> str:
    """One row per report: mentions, entities, micro recall@k and macro accuracy."""
    ks = list(ks or sorted(reports[0].recall)) if reports else []
    headers = ["model", "mentions", "entities", *[f"R@{k}" for k in ks], "macro acc"]
    rows = [
        [
            report.name,
            str(report.num_mentions),
            str(report.num_entities),
            *[f"{report.recall[k]:.3f}" for k in ks],
            f"{report.macro_accuracy:.3f}",
        ]
        for report in reports
    ]
    return text_table(headers, rows)


def write_reports(reports: Sequence[RecallReport], path: Path) -> Path:
    """JSON: a list of reports (micro, macro and per-domain figures)."""
    return write_json_report(path, [report.to_json() for report in reports])
