"""``refresh.trigger: payoff`` (the default): a checkpoint asks for a refresh only when the
refresh pays for itself.

ANCE (Xiong et al. 2021, §3.2) pays a pass over the catalogue every fixed number of steps;
Lindgren et al. 2021 (*Efficient Training of Retrieval Models Using Negative Cache*, §3.3) keep a
cache fresh by re-encoding a share of it every step and never pay one. This trigger sits between
them: a cache its steps keep writing usually stays fresh where training looks, and a full refresh
is paid for only when the rows the trainer draws have aged and there is time left to train on the
new ones.

The staleness signal is what the trainer drew since the previous checkpoint: ā, the mean age in
steps of the vectors its hard negatives were scored by (a negative cache row's age, t minus the
step that wrote it; without a cache, the lag of the negatives version they were mined from;
:class:`~hnce.cluster.compute.refresh.drawn.NegativeFreshness`). With A =
``refresh.payoff.max_negative_age``, T = ``training.steps``, and R, s̄ and φ of
:class:`~hnce.cluster.compute.refresh.timing.RefreshTiming` (L = R / s̄ the steps a refresh takes
to publish),

    refresh at t  ⟺  ā ≥ A  and  (T - t) - L ≥ max(A, L + D),   D = L · (1 - 1/φ):

the negatives drawn now are stale, and the version the refresh would publish is trained on
afterwards for at least as many steps as it took to make plus those it cost the trainer (D: the
steps beside it run φ times slower where its encoders share the trainer's cores; φ = 1 under
``training.cores: reserved``), and at least A. When R is not known yet (no refresh has published
and the initial negatives encoded nothing), a stale checkpoint asks: that refresh measures R. One
request at a time: after one, no checkpoint asks until the refresh log records the refresh of
that checkpoint or a later one, whatever its outcome. Every decision is a ``refresh_decision``
event and a log line, with the numbers it came from.

Example::

    trigger = SPEC.build(context)             # at every checkpoint:
    decision = trigger.at_checkpoint(30)
    decision.refresh, decision.fields["reason"]     # (False, "fresh")
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from hnce.cluster.compute.refresh.drawn import DrawnNegatives, DrawWindow
from hnce.cluster.compute.refresh.policy import (
    NO_REFRESH,
    Decision,
    TriggerContext,
    TriggerSpec,
)
from hnce.cluster.compute.refresh.timing import RefreshTiming
from hnce.settings import PositiveInt, settings


@settings
class PayoffOptions:
    """``refresh.payoff``: when a refresh pays (module docs).

    Attributes:
        max_negative_age: A, the mean age in steps of the vectors that scored the hard negatives
            drawn since the previous checkpoint from which a refresh may pay; it must then also
            be trained on for at least as many steps.
    """

    max_negative_age: PositiveInt = 20


#: why :meth:`RefreshPayoff.decide` decided as it did
DecisionReason = Literal["pays", "fresh", "late", "unknown cost", "pending", "no hard negatives"]


@dataclass(frozen=True)
class PayoffDecision:
    """At the checkpoint of ``step``: whether it asks for a refresh, why, and the numbers of the
    module docs' rule (None where unknown): ā (``mean_age``) over ``hard_negatives``, A
    (``max_age``), R (``refresh_seconds``, from ``cost_source``), s̄ (``step_seconds``), L
    (``latency_steps``), φ (``slowdown``: measured, ``slowdown_measured``, or the prior), D
    (``lost_steps``) and T - t (``steps_left``)."""

    step: int
    refresh: bool
    reason: DecisionReason
    mean_age: float | None
    hard_negatives: int
    max_age: int
    refresh_seconds: float | None
    cost_source: Literal["refresh", "initial negatives"] | None
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
    """The module docs' decision for one run; one per worker (rank 0's decides)."""

    timing: RefreshTiming
    steps: int
    max_age: int
    drawn: DrawWindow | None = None
    pending: int | None = None  # the checkpoint whose refresh was asked for and not yet recorded

    def decide(self, step: int, drawn: DrawnNegatives) -> PayoffDecision:
        """Whether the checkpoint of ``step`` asks for a refresh, from the hard negatives
        ``drawn`` since the previous checkpoint (module docs); while the refresh of an earlier
        checkpoint is pending (:meth:`asked`), none."""
        timing = self.timing
        timing.read_log()
        if self.pending is not None and timing.refreshed_through >= self.pending:
            self.pending = None
        cost, source = timing.refresh_seconds, "refresh"
        if cost is None:
            cost, source = timing.initial_seconds, "initial negatives"
        mean = timing.mean_step_seconds
        latency = None if cost is None or not mean else cost / mean
        measured = timing.measured_slowdown()
        slowdown = timing.slowdown_prior if measured is None else measured
        lost = None if latency is None else latency * (1 - 1 / slowdown)
        steps_left = self.steps - step
        age = drawn.mean_age
        reason: DecisionReason
        if self.pending is not None:
            reason = "pending"
        elif age is None:
            reason = "no hard negatives"
        elif age < self.max_age:
            reason = "fresh"
        elif latency is None or lost is None:
            reason = "unknown cost"
        elif steps_left - latency < max(self.max_age, latency + lost):
            reason = "late"
        else:
            reason = "pays"
        return PayoffDecision(
            step=step,
            refresh=reason in ("pays", "unknown cost"),
            reason=reason,
            mean_age=age,
            hard_negatives=drawn.hard,
            max_age=self.max_age,
            refresh_seconds=cost,
            cost_source=None if cost is None else source,
            step_seconds=mean,
            latency_steps=latency,
            steps_left=steps_left,
            slowdown=slowdown,
            slowdown_measured=measured is not None,
            lost_steps=lost,
        )

    def after_step(self, step: int, loss: float, version: int | None) -> None:
        pass

    def look(self, step: int) -> Decision:
        return NO_REFRESH

    def at_checkpoint(self, step: int) -> Decision:
        """:meth:`decide` on what was drawn since the previous checkpoint."""
        assert self.drawn is not None
        decision = self.decide(step, self.drawn.take())
        return Decision(decision.refresh, dataclasses.asdict(decision), decision.describe())

    def asked(self, step: int) -> None:
        """The checkpoint of ``step`` asked for a refresh: no other asks until the refresh log
        records that refresh or a later one."""
        self.pending = step


def _summary(decisions: list[dict[str, Any]]) -> str:
    """``hnce status``: how many checkpoints asked, and the last decision."""
    if not decisions:
        return "payoff: no checkpoint decided yet"
    last = decisions[-1]
    asked = sum(1 for decision in decisions if decision.get("refresh"))
    age = last.get("mean_age")
    age = f"{age:.1f} steps" if isinstance(age, int | float) else "unknown"
    verb = "refresh" if last.get("refresh") else "no refresh"
    return (
        f"payoff: {asked} refresh(es) asked for; at step {last.get('step')}: {verb} "
        f"({last.get('reason')}), hard negatives {age} old on average"
    )


def _build(context: TriggerContext) -> RefreshPayoff:
    options = context.options
    return RefreshPayoff(context.timing, context.steps, options.max_negative_age, context.drawn)


SPEC = TriggerSpec(
    name="payoff",
    build=_build,
    options=PayoffOptions,
    scalars={
        "mean_age": "refresh/decision_mean_age_steps",
        "slowdown": "refresh/decision_slowdown",
    },
    summary=_summary,
)
