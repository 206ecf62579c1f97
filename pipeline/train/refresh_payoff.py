"""Whether a refresh started now can still publish before training ends (asynchronous refresh).

ANCE's asynchronous refresh (Xiong et al. 2021, §3.2) pays a pass over the catalogue for
negatives the trainer then trains on. A refresh asked for at step t publishes its version no
sooner than R seconds later, R the duration of the run's fastest published refresh less the
seconds it spent starting its encoder pool (the records in the run's refresh log,
``hnce.cluster.stores.refresh_log``: a run's first refresh starts the pool that its later ones
keep), and the run has

    (T - t) · s̄   seconds left,    T = ``training.steps``, s̄ = the mean seconds of its steps so far.

When R ≥ (T - t) · s̄ that version would publish after the last step: the training coordinator
would abandon the refresh when training ends, and until then its encoder actors hold the cores
that ``training.cores: handover`` gives the trainer while no refresh encodes. The checkpoint of
step t then says that refreshes have ended (``refreshes_end`` in its ``training_state.json``,
``hnce.cluster.stores.checkpoints.ends_refreshes``) and the coordinator starts none from it or
from an older request. The last checkpoint always ends them (nothing trains on what it would
mine). Before any refresh has published, R is unknown and every checkpoint asks as the recipe
says (``refresh.trigger``).

With ``refresh.trigger: payoff`` the same numbers decide, at every checkpoint t, whether a
refresh is asked for at all (:meth:`RefreshPayoff.decide`). The staleness signal is what the
trainer drew since the previous checkpoint: ā, the mean age in steps of the vectors its hard
negatives were scored by (a negative cache row's age, t minus the step that wrote it; without a
cache, the lag of the negatives version they were mined from;
:class:`~hnce.pipeline.train.negative_cache.NegativeFreshness`). With A =
``refresh.max_negative_age`` and L = R / s̄ the steps a refresh takes to publish,

    refresh at t  ⟺  ā ≥ A  and  (T - t) - L ≥ max(A, L + D):

the negatives drawn now are stale, and the version the refresh would publish is trained on
afterwards for at least as many steps as it took to make plus those it cost the trainer, and at
least A. D is that cost: where the refresh's encoders share the trainer's cores, the steps beside
it run φ times slower, and D = L · (1 - 1/φ) steps are lost to them. φ is measured in the run
(the mean seconds of the steps that ended while a refresh of the refresh log was running, over
the others'); before any refresh has run it is the trainer's threads with no refresh over its
threads beside one (``training.cores: handover``: e.g. 2 threads, then 1: φ = 2; ``reserved``:
the encoders have their own cores, φ = 1). Before any refresh
has published, R is version 0's seconds where it encoded the catalogue (the ``initial_negatives``
event: the same pass over the catalogue, made by the starting model); when neither is known, a
stale checkpoint asks (that refresh measures R). One request at a time: after one, no checkpoint asks until the refresh log
records the refresh of that checkpoint or a later one, whatever its outcome. Every decision is
an event (``refresh_decision``) and a log line, with the numbers it came from.

Lindgren et al. 2021 (*Efficient Training of Retrieval Models Using Negative Cache*, §3.3) keep
the cache fresh by re-encoding a share of it every step and never pay a full pass; ANCE
(Xiong et al. 2021, §3.2) pays one every fixed number of steps. The policy sits between them: a
cache its steps keep writing usually stays fresh where training looks (its ā stays low), and a
full refresh is paid for only when the rows the trainer draws have aged and there is time left
to train on the new ones.

Example::

    payoff = RefreshPayoff(run_dir, steps=60, slowdown_prior=2.0)
    payoff.observe(2.4)                      # after every step: its seconds
    estimate = payoff.estimate(45)           # at a checkpoint
    estimate.ends                            # True: no refresh would land in time
    decision = payoff.decide(30, drawn, max_age=20)
    decision.refresh, decision.reason        # (False, "fresh")
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from hnce.cluster.stores.refresh_log import fastest_refresh_seconds, read_log
from hnce.events import RunEvent
from hnce.pipeline.event_log import read_events
from hnce.pipeline.train.negative_cache import DrawnNegatives


@dataclass(frozen=True)
class PayoffEstimate:
    """At one checkpoint: the fastest published refresh's seconds without its pool's start (None
    before the first), the seconds training has left, and whether refreshes end here."""

    step: int
    refresh_seconds: float | None
    seconds_left: float | None
    ends: bool


#: why :meth:`RefreshPayoff.decide` decided as it did
DecisionReason = Literal["pays", "fresh", "late", "unknown cost", "pending", "no hard negatives"]


@dataclass(frozen=True)
class RefreshDecision:
    """At the checkpoint of ``step``: whether it asks for a refresh, why, and the numbers of the
    module docs' rule (None where unknown): ā (``mean_age``) over ``hard_negatives``, A
    (``max_age``), R (``refresh_seconds``, from ``cost_source``), s̄ (``step_seconds``), L
    (``latency_steps``), the slowdown (``slowdown``: measured, ``slowdown_measured``, or the
    prior), D (``lost_steps``) and T - t (``steps_left``)."""

    step: int
    refresh: bool
    reason: DecisionReason
    mean_age: float | None
    hard_negatives: int
    max_age: int
    refresh_seconds: float | None
    cost_source: Literal["refresh", "version 0"] | None
    step_seconds: float | None
    latency_steps: float | None
    steps_left: int
    slowdown: float = 1.0
    slowdown_measured: bool = False
    lost_steps: float | None = None

    def describe(self) -> str:
        """One line for the log: the decision and the numbers it came from."""
        age = "?" if self.mean_age is None else f"{self.mean_age:.1f}"
        cost = (
            "an unknown time"
            if self.latency_steps is None
            else f"~{self.latency_steps:.0f} steps ({self.refresh_seconds:.0f} s by "
            f"{self.cost_source}, {self.step_seconds:.2f} s a step) and costs the trainer "
            f"~{self.lost_steps:.0f} (steps {self.slowdown:.2f}x slower beside it, "
            f"{'measured' if self.slowdown_measured else 'from its threads'})"
        )
        verb = "refresh" if self.refresh else "no refresh"
        return (
            f"step {self.step}: {verb} ({self.reason}): {self.hard_negatives} hard negatives "
            f"{age} steps old on average (refresh from {self.max_age}); a refresh publishes in "
            f"{cost}; {self.steps_left} steps left"
        )


@dataclass
class RefreshPayoff:
    """The module docs' estimate and decision for one run; one per worker (rank 0's decides)."""

    run_dir: Path
    steps: int
    slowdown_prior: float = 1.0  # the slowdown before any refresh has run (module docs)
    step_seconds: list[float] = field(default_factory=list)
    step_ends: list[float] = field(default_factory=list)  # epoch seconds each step ended
    refresh_windows: list[tuple[float, float]] = field(default_factory=list)
    refresh_seconds: float | None = None
    log_offset: int = 0
    refreshed_through: int = -1  # the latest checkpoint the refresh log has a record of
    pending: int | None = None  # the checkpoint whose refresh was asked for and not yet recorded

    def observe(self, seconds: float, ended: float | None = None) -> None:
        """Record one step's seconds, and when it ended (epoch seconds; now by default)."""
        self.step_seconds.append(seconds)
        self.step_ends.append(time.time() if ended is None else ended)

    def _read_log(self) -> None:
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
        if self.pending is not None and self.refreshed_through >= self.pending:
            self.pending = None

    @functools.cached_property
    def version_zero_seconds(self) -> float | None:
        """:func:`version_zero_seconds` of the run, read once: version 0 is live before the
        first step, so its event is written before any checkpoint decides."""
        return version_zero_seconds(self.run_dir)

    def measured_slowdown(self) -> float | None:
        """The slowdown measured: the mean seconds of the steps that ended while a refresh ran
        over the others' (None until there are both; never below 1)."""
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

    def estimate(self, step: int) -> PayoffEstimate:
        """Whether refreshes end at the checkpoint of ``step`` (module docs)."""
        self._read_log()
        mean = self.mean_step_seconds
        seconds_left = None if mean is None else (self.steps - step) * mean
        ends = step >= self.steps or (
            self.refresh_seconds is not None
            and seconds_left is not None
            and self.refresh_seconds >= seconds_left
        )
        return PayoffEstimate(step, self.refresh_seconds, seconds_left, ends)

    def decide(self, step: int, drawn: DrawnNegatives, max_age: int) -> RefreshDecision:
        """``refresh.trigger: payoff``: whether the checkpoint of ``step`` asks for a refresh,
        from the hard negatives ``drawn`` since the previous checkpoint and A = ``max_age``
        (module docs); while the refresh of an earlier checkpoint is pending (:meth:`asked`),
        none."""
        self._read_log()
        cost, source = self.refresh_seconds, "refresh"
        if cost is None:
            cost, source = self.version_zero_seconds, "version 0"
        mean = self.mean_step_seconds
        latency = None if cost is None or not mean else cost / mean
        measured = self.measured_slowdown()
        slowdown = self.slowdown_prior if measured is None else measured
        lost = None if latency is None else latency * (1 - 1 / slowdown)
        steps_left = self.steps - step
        age = drawn.mean_age
        reason: DecisionReason
        if self.pending is not None:
            reason = "pending"
        elif age is None:
            reason = "no hard negatives"
        elif age < max_age:
            reason = "fresh"
        elif latency is None or lost is None:
            reason = "unknown cost"
        elif steps_left - latency < max(max_age, latency + lost):
            reason = "late"
        else:
            reason = "pays"
        return RefreshDecision(
            step=step,
            refresh=reason in ("pays", "unknown cost"),
            reason=reason,
            mean_age=age,
            hard_negatives=drawn.hard,
            max_age=max_age,
            refresh_seconds=cost,
            cost_source=None if cost is None else source,
            step_seconds=mean,
            latency_steps=latency,
            steps_left=steps_left,
            slowdown=slowdown,
            slowdown_measured=measured is not None,
            lost_steps=lost,
        )

    def asked(self, step: int) -> None:
        """The checkpoint of ``step`` asked for a refresh: no other asks until the refresh log
        records that refresh or a later one."""
        self.pending = step


def version_zero_seconds(run_dir: Path) -> float | None:
    """The seconds the run's negatives version 0 took to prepare with the starting model where
    it encoded the catalogue (its ``initial_negatives`` event), or None (none was, it failed, or
    it took its index over from an evaluation and its seconds are mining alone)."""
    for event in reversed(read_events(run_dir, RunEvent.INITIAL_NEGATIVES)):
        if event.get("initial") == "model" and event.get("error") is None and event.get("encoded"):
            return float(event["seconds"])
    return None
