"""Recall of ranked candidate lists, computed one way for every evaluation (``hnce eval``, the
held-out recall of each refresh, the demo, the reranker, the benchmarks).

A ranked candidate list per mention goes in; what comes out is, per mention, the rank of its
first correct entity (:func:`first_correct_rank`: a mention may have several correct entities,
``golds``; one whose gold is missing from the catalogue has none and counts as an error). A
:class:`RecallReport` aggregates those ranks micro (over mentions), per domain and macro (the mean
of the per-domain figures: Zeshel's macro-averaged accuracy) and, given the entities the training
split links to, apart for mentions of *seen* entities (some correct entity is one a training
mention links to) and *unseen* ones (none is): training on an entity's own mentions and
generalising to entities it never saw are different regimes, and a recipe may help one and hurt
the other. Pure numpy: it lives beside the
retrieval that produces the candidates so that the refresh, below the pipeline, scores with it
too; ``hnce.pipeline.metrics`` shows and writes the reports.

Example::

    report = recall_report("trained", candidates, mentions, ks=[1, 64], num_entities=N)
    report.recall[64]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from hnce.cluster.stores.tables import Mention

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


def seen_flags(golds: Sequence[Sequence[int]], training_golds: set[int]) -> np.ndarray:
    """Bool [M]: is some correct entity of mention i one that a training mention links to?"""
    return np.array([bool(correct & training_golds) for correct in correct_sets(golds)], bool)


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
    #: "seen" / "unseen" -> mentions and recall@k (:func:`seen_flags`); empty when not asked
    per_exposure: dict[str, dict[str, float]] = field(default_factory=dict)
    #: per mention (not written to JSON): bool [M, len(recall)] hits at each k, in ``recall``'s
    #: order, and bool [M] seen flags (None when not asked): what a paired comparison reads
    hits: np.ndarray | None = field(default=None, repr=False, compare=False)
    seen: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def accuracy(self) -> float:
        return self.recall[1] if 1 in self.recall else float("nan")

    @property
    def macro_accuracy(self) -> float:
        return self.macro_recall[1] if 1 in self.macro_recall else float("nan")

    def to_json(self) -> dict[str, object]:
        payload = asdict(replace(self, hits=None, seen=None))
        del payload["hits"], payload["seen"]
        payload["accuracy"] = self.accuracy
        payload["macro_accuracy"] = self.macro_accuracy
        return payload


def summarise(
    name: str,
    hits: np.ndarray,
    domains: Sequence[str],
    ks: Sequence[int],
    num_entities: int,
    seen: np.ndarray | None = None,
) -> RecallReport:
    """Micro and macro (over domains) recall from a hit matrix (:func:`hits_at`), and apart
    for the mentions of seen and unseen entities when ``seen`` (:func:`seen_flags`) is given."""
    recall = {k: float(hits[:, j].mean()) if len(hits) else 0.0 for j, k in enumerate(ks)}

    def figures(rows: np.ndarray) -> dict[str, float]:
        return {
            "mentions": float(len(rows)),
            **{f"recall@{k}": float(hits[rows, j].mean()) for j, k in enumerate(ks)},
        }

    per_domain = {domain: figures(rows) for domain, rows in by_domain(domains).items()}
    macro = macro_average(per_domain, lambda figures, k: figures[f"recall@{k}"], ks)
    per_exposure = {}
    if seen is not None:
        for exposure, rows in (("seen", np.flatnonzero(seen)), ("unseen", np.flatnonzero(~seen))):
            if len(rows):
                per_exposure[exposure] = figures(rows)
    return RecallReport(
        name,
        len(hits),
        num_entities,
        recall,
        macro,
        per_domain,
        per_exposure=per_exposure,
        hits=hits,
        seen=seen,
    )


def recall_report(
    name: str,
    candidates: np.ndarray,
    mentions: Sequence[Mention],
    ks: Sequence[int],
    num_entities: int,
    training_golds: set[int] | None = None,
) -> RecallReport:
    """Recall@``ks`` of ``candidates`` [M, k] (best first) for ``mentions``, each of whose
    ``golds`` (else its ``gold``) counts as correct; apart for seen and unseen entities when
    the entities training links to (``training_golds``) are given."""
    golds = [m.golds or (m.gold,) for m in mentions]
    hits = hits_at(candidates, golds, ks)
    seen = None if training_golds is None else seen_flags(golds, training_golds)
    return summarise(name, hits, [m.domain for m in mentions], ks, num_entities, seen)
