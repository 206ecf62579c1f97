"""How the trainer meets the refreshes (``refresh.mode``), one module each.

- ``async`` (:mod:`~hnce.cluster.compute.refresh.modes.asynchronous`, the default): the
  coordinator refreshes beside a trainer that never waits, and the refreshes end once none would
  publish before training ends (ANCE's asynchronous refresh).
- ``sync`` (:mod:`~hnce.cluster.compute.refresh.modes.synchronous`): at every checkpoint the
  trainer waits until the negatives mined with it are live (the paper's own code, EntQA).

A mode answers the hand-over (:class:`~hnce.cluster.compute.refresh.handover.RefreshHandover`)
two questions: whether training waits before ``step`` (:meth:`RefreshMode.waits_at`), and whether
the checkpoint of ``step`` ends the run's refreshes (:meth:`RefreshMode.refreshes_end`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class RefreshesEnd:
    """At one checkpoint: R, the fastest published refresh's seconds without its pool's start
    (None before the first), the seconds training has left (None when unknown), and whether the
    run's refreshes end here."""

    step: int
    refresh_seconds: float | None
    seconds_left: float | None
    ends: bool


class RefreshMode(Protocol):
    """How the trainer meets the refreshes (module docs)."""

    def waits_at(self, step: int) -> bool:
        """Whether training waits before ``step`` for the negatives of that step's checkpoint."""
        ...

    def refreshes_end(self, step: int) -> RefreshesEnd:
        """Whether the checkpoint of ``step`` ends the run's refreshes, and the figures why."""
        ...
