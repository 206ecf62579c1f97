"""Recall curves: each method's recall at a few points of its training, and its finished run as
the benchmark's state file keeps it.

Example::

    curve = Curve("hnce", [(41.0, 30, {1: 0.41, 8: 0.7, 64: 0.9})])
    curve.seconds_to_reach(0.4)     # 41.0
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

KS = (1, 8, 64)

Recall = dict[int, float]


def recall_from_json(raw: dict[str, float] | None) -> Recall | None:
    """R@k read back from JSON (its keys strings there), in the order of :data:`KS`."""
    if raw is None:
        return None
    by_k = {int(k): value for k, value in raw.items()}
    return {k: by_k[k] for k in KS}


@dataclass
class Curve:
    """Recall of one method at a few points of its training: (wall seconds, step, R@k)."""

    name: str
    points: list[tuple[float, int, Recall]] = field(default_factory=list)

    @property
    def final(self) -> Recall:
        return self.points[-1][2]

    def seconds_to_reach(self, recall_at_1: float) -> float | None:
        """Wall seconds at the first measured point whose R@1 reaches ``recall_at_1``."""
        return next((s for s, _, r in self.points if r[1] >= recall_at_1), None)


@dataclass
class Trained:
    """One method's finished run: its curve, wall seconds (``total`` and, for the peer,
    ``mining``), the mention ids it trained on in order, and the product-path check."""

    curve: Curve
    seconds: dict[str, float]
    trained: list[str] = field(default_factory=list)
    product: Recall | None = None

    def to_json(self) -> dict[str, Any]:
        """The run as the state file keeps it."""
        return {
            "name": self.curve.name,
            "points": self.curve.points,
            "seconds": self.seconds,
            "trained": self.trained,
            "product": self.product,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Trained:
        """A run read back from the state file."""
        points = [(s, step, recall_from_json(r)) for s, step, r in raw["points"]]
        return cls(
            Curve(raw["name"], points),
            dict(raw["seconds"]),
            list(raw.get("trained", [])),
            recall_from_json(raw.get("product")),
        )


@dataclass
class SeedRuns:
    """Both methods' finished runs with one seed."""

    seed: int
    hnce: Trained
    peer: Trained
