"""What a refresh costs and how fast the trainer steps, as one worker sees them during a run.

R, the seconds a refresh takes to publish, is the run's fastest published refresh less the
seconds it spent starting its encoder pool (the refresh log,
:func:`hnce.cluster.stores.refresh_log.fastest_refresh_seconds`: a run's first refresh starts
the pool its later ones keep); before any refresh has published, the initial negatives' seconds
where they encoded the catalogue (:func:`initial_negatives_seconds`: the same pass over the
catalogue, by the starting model). s̄ is the mean seconds of the steps so far, and φ the
slowdown of a step beside a refresh: the mean seconds of the steps that ended while a refresh of
the log was running over the others' (before one has run, a prior from the trainer's threads).

The asynchronous mode ends the refreshes from these figures
(:mod:`hnce.cluster.compute.refresh.modes.asynchronous`) and the payoff trigger decides from them
(:mod:`hnce.cluster.compute.refresh.triggers.payoff`).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from pathlib import Path

from hnce.cluster.stores.refresh_log import fastest_refresh_seconds, read_log
from hnce.cluster.stores.run_events import read_events
from hnce.events import RunEvent


@dataclass
class RefreshTiming:
    """R, s̄ and φ of the module docs for one run, from one worker's steps and the refresh log."""

    run_dir: Path
    slowdown_prior: float = 1.0  # φ before any refresh has run (module docs)
    step_seconds: list[float] = field(default_factory=list)
    step_ends: list[float] = field(default_factory=list)  # epoch seconds each step ended
    refresh_windows: list[tuple[float, float]] = field(default_factory=list)
    refresh_seconds: float | None = None
    log_offset: int = 0
    refreshed_through: int = -1  # the latest checkpoint the refresh log has a record of

    def observe(self, seconds: float, ended: float | None = None) -> None:
        """Record one step's seconds, and when it ended (epoch seconds; now by default)."""
        self.step_seconds.append(seconds)
        self.step_ends.append(time.time() if ended is None else ended)

    def read_log(self) -> None:
        """Take in the refresh records appended since the last read."""
        log = read_log(self.run_dir, self.log_offset)
        self.log_offset = log.offset
        fastest = fastest_refresh_seconds(log.records)
        if fastest is not None:
            known = self.refresh_seconds
            self.refresh_seconds = fastest if known is None else min(known, fastest)
        for record in log.records:
            if record.checkpoint is not None:
                self.refreshed_through = max(self.refreshed_through, record.checkpoint)
            if record.seconds > 0:
                self.refresh_windows.append((record.started, record.started + record.seconds))

    @functools.cached_property
    def initial_seconds(self) -> float | None:
        """:func:`initial_negatives_seconds` of the run, read once: the initial negatives are
        live before the first step, so their event is written before any checkpoint decides."""
        return initial_negatives_seconds(self.run_dir)

    def measured_slowdown(self) -> float | None:
        """φ measured: the mean seconds of the steps that ended while a refresh ran over the
        others' (None until there are both; never below 1)."""
        beside, alone = [], []
        for seconds, ended in zip(self.step_seconds, self.step_ends, strict=True):
            inside = any(start <= ended <= end for start, end in self.refresh_windows)
            (beside if inside else alone).append(seconds)
        if not beside or not alone:
            return None
        return max(1.0, (sum(beside) / len(beside)) / (sum(alone) / len(alone)))

    @property
    def mean_step_seconds(self) -> float | None:
        """s̄: the mean seconds of the steps so far (None before the first)."""
        if not self.step_seconds:
            return None
        return sum(self.step_seconds) / len(self.step_seconds)


def initial_negatives_seconds(run_dir: Path) -> float | None:
    """The seconds the run's initial negatives took to prepare with the starting model where they
    encoded the catalogue (their ``initial_negatives`` event), or None (none were, they failed,
    or their index was taken over from an evaluation and their seconds are mining alone)."""
    for event in reversed(read_events(run_dir, RunEvent.INITIAL_NEGATIVES)):
        if event.get("initial") == "model" and event.get("error") is None and event.get("encoded"):
            return float(event["seconds"])
    return None
