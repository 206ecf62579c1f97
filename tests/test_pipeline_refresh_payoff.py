"""A refresh that would publish after training ends is not asked for (the asynchronous mode,
hnce.cluster.compute.refresh.modes.asynchronous), the payoff trigger asks only for one that pays
(hnce.cluster.compute.refresh.triggers.payoff) by the costs of the refresh log's valid records,
and the coordinator starts none once the trainer's newest checkpoint says so
(hnce.cluster.stores.checkpoints.refresh_requests) or once the run's fastest refresh would take it
past the end that checkpoint expects (hnce.cluster.compute.refresh.job.publishes_late)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
from store_helpers import write_checkpoint

from hnce.cluster.compute.refresh.coordinator import COORDINATOR_ROLE, RefreshTally
from hnce.cluster.compute.refresh.drawn import DrawnNegatives
from hnce.cluster.compute.refresh.engine import NoCheckpointError
from hnce.cluster.compute.refresh.job import attempt_refresh, publishes_late, refresh_target
from hnce.cluster.compute.refresh.modes.asynchronous import AsyncMode
from hnce.cluster.compute.refresh.plan import RefreshPlan
from hnce.cluster.compute.refresh.timing import RefreshTiming
from hnce.cluster.compute.refresh.triggers.payoff import RefreshPayoff
from hnce.cluster.stores.checkpoints import complete_checkpoints, refresh_requests
from hnce.cluster.stores.refresh_log import LOG_FILE, RefreshRecord, append_record
from hnce.events import RunEvent
from hnce.pipeline.event_log import EventLog
from hnce.pipeline.train.trainer import TrainingSummary


def _published(
    run_dir: Path, seconds: float, outcome: str = "published", start_seconds: float = 0.0
) -> None:
    record = RefreshRecord(outcome, "training coordinator", started=0.0, seconds=seconds)
    record.start_seconds = start_seconds
    append_record(run_dir, record)


def _payoff(run_dir: Path, steps: int, max_age: int, slowdown_prior: float = 1.0) -> RefreshPayoff:
    return RefreshPayoff(RefreshTiming(run_dir, slowdown_prior), steps, max_age)


def test_refreshes_end_when_the_last_refresh_would_publish_after_the_last_step(
    tmp_path: Path,
) -> None:
    payoff = AsyncMode(RefreshTiming(tmp_path), steps=60)
    for _ in range(15):
        payoff.timing.observe(2.0)
    # no refresh has published yet: its duration is unknown, so the checkpoint asks
    assert not payoff.refreshes_end(15).ends
    _published(tmp_path, 100.0, outcome="abandoned")  # not a duration to publish
    assert not payoff.refreshes_end(15).ends
    _published(tmp_path, 100.0)
    estimate = payoff.refreshes_end(15)  # 45 steps of 2 s left: 90 s, less than the last refresh
    assert (estimate.refresh_seconds, estimate.seconds_left, estimate.ends) == (100.0, 90.0, True)
    assert not payoff.refreshes_end(5).ends  # 110 s left
    assert payoff.refreshes_end(10).ends  # 100 s left: it would publish as training ends
    _published(tmp_path, 50.0)  # the fastest refresh decides (a first one starts the pool)
    assert not payoff.refreshes_end(30).ends and payoff.refreshes_end(40).ends
    _published(tmp_path, 80.0)
    assert not payoff.refreshes_end(30).ends
    _published(tmp_path, 60.0, start_seconds=20.0)  # the pool's start is not a refresh's cost
    assert payoff.refreshes_end(30).refresh_seconds == 40.0
    assert not payoff.refreshes_end(35).ends and payoff.refreshes_end(40).ends


def test_the_last_checkpoint_always_ends_refreshes(tmp_path: Path) -> None:
    payoff = AsyncMode(RefreshTiming(tmp_path), steps=60)
    assert not payoff.refreshes_end(59).ends  # nothing known: ask
    assert payoff.refreshes_end(60).ends


def test_the_coordinator_starts_nothing_once_the_newest_checkpoint_ends_refreshes(
    tmp_path: Path,
) -> None:
    write_checkpoint(tmp_path, 15, refresh=True)
    write_checkpoint(tmp_path, 30, refresh=True)
    plan = RefreshPlan(tmp_path, tmp_path / "data")
    assert refresh_target(plan, requests_only=True) == (30, True)
    write_checkpoint(tmp_path, 45, refresh=False, ends_refreshes=True)
    assert refresh_requests(complete_checkpoints(tmp_path)) == []
    with pytest.raises(NoCheckpointError, match="any more"):
        refresh_target(plan, requests_only=True)
    assert refresh_target(plan) == (45, True)  # `hnce refresh` still refreshes the newest


def test_the_coordinator_starts_no_refresh_that_would_publish_after_the_expected_end(
    tmp_path: Path,
) -> None:
    """The trainer asked at its checkpoint before any refresh had published; the first then
    publishes (100 s without its pool's start): the coordinator starts none from that request
    when 100 s from now falls after the end the newest checkpoint expects, and does when it
    falls before. `hnce refresh` is not concerned."""
    plan = RefreshPlan(tmp_path, tmp_path / "data")
    write_checkpoint(tmp_path, 15, refresh=True, ends_at=time.time() + 500.0)
    write_checkpoint(tmp_path, 30, refresh=True, ends_at=time.time() + 90.0)
    assert refresh_target(plan, requests_only=True) == (30, True)  # no refresh published yet
    _published(tmp_path, 120.0, start_seconds=20.0)
    assert publishes_late(plan, time.time() - 20.0) is None  # started 20 s ago: 80 s to go
    late = publishes_late(plan, time.time())
    assert late is not None and "fastest refresh took 100 s" in late and "step-30" in late
    with pytest.raises(NoCheckpointError, match="no refresh any more"):
        refresh_target(plan, requests_only=True)
    assert refresh_target(plan) == (30, True)
    write_checkpoint(tmp_path, 45, refresh=True, ends_at=time.time() + 300.0)  # slower steps
    assert refresh_target(plan, requests_only=True) == (45, True)
    write_checkpoint(tmp_path, 60, refresh=True)  # a trainer that did not say: no estimate
    assert publishes_late(plan, time.time()) is None


def test_the_coordinator_says_once_why_its_refreshes_are_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Polls after the fastest refresh would land past the expected end come back as
    no-checkpoint records; the coordinator logs the first with its reason, not every poll, and
    its status carries the reason."""
    plan = RefreshPlan(tmp_path, tmp_path / "data")
    write_checkpoint(tmp_path, 30, refresh=True, ends_at=time.time() + 60.0)
    _published(tmp_path, 100.0)
    tally = RefreshTally()
    with caplog.at_level(logging.INFO, logger="hnce.cluster.compute.refresh.coordinator"):
        for _ in range(3):
            record = attempt_refresh(plan, COORDINATOR_ROLE, requests_only=True)
            assert record.outcome == "no-checkpoint"
            tally.note(record)
    over = [line for line in caplog.messages if line.startswith("refreshes end here")]
    assert len(over) == 1 and "fastest refresh took 100 s" in over[0], caplog.messages
    assert "after the end of training" in str(tally.status()["refreshes_over"])
    summary = TrainingSummary(tmp_path, steps=60, final_loss=0.5, seconds=90.0)
    summary.note_refreshes(tally.status())
    assert "0 refreshes (then none: any other would have published after" in summary.line()
    summary.note_refreshes(RefreshTally().status())
    assert "0 refreshes, " in summary.line()


def _drawn(mean_age: int, hard: int = 100) -> DrawnNegatives:
    return DrawnNegatives(hard=hard, fresh=0, aged=hard, age_sum=mean_age * hard)


def test_a_refresh_is_asked_for_only_when_it_pays(tmp_path: Path) -> None:
    """``refresh.trigger: payoff`` on hand-made costs (120 steps of 1.5 s, A = 20): fresh
    negatives ask for nothing; stale ones with no known cost ask (that refresh measures it), and
    nothing else asks until the refresh log records it; then a 60 s refresh (40 steps) pays while
    it would be trained on for at least 40 steps after it lands, and is late after."""
    payoff = _payoff(tmp_path, steps=120, max_age=20)
    for _ in range(30):
        payoff.timing.observe(1.5)
    fresh = payoff.decide(30, _drawn(10))
    assert (fresh.refresh, fresh.reason, fresh.mean_age) == (False, "fresh", 10.0)
    unknown = payoff.decide(30, _drawn(30))
    assert (unknown.refresh, unknown.reason, unknown.latency_steps) == (True, "unknown cost", None)
    payoff.asked(30)
    assert payoff.decide(40, _drawn(40)).reason == "pending"
    record = RefreshRecord("published", "training coordinator", started=0.0, seconds=60.0)
    record.checkpoint = 30
    append_record(tmp_path, record)
    pays = payoff.decide(40, _drawn(40))  # 80 steps left: 40 after it lands
    assert (pays.refresh, pays.reason, pays.latency_steps, pays.steps_left) == (
        True,
        "pays",
        40.0,
        80,
    )
    assert (pays.refresh_seconds, pays.cost_source, pays.step_seconds) == (60.0, "refresh", 1.5)
    late = payoff.decide(45, _drawn(40))  # 35 steps after it lands, fewer than 40
    assert (late.refresh, late.reason) == (False, "late")
    assert _payoff(tmp_path, steps=120, max_age=50).decide(40, _drawn(40)).reason == "fresh"
    assert payoff.decide(40, DrawnNegatives()).reason == "no hard negatives"


def test_a_damaged_refresh_record_is_named_never_taken_as_a_refresh_s_cost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Lines of the refresh log with negative or infinite seconds, or a pool start longer than
    its refresh, are named as damaged (file:line) and skipped: a refresh of -50 s taken as the
    cost would make every refresh pay."""
    payoff = _payoff(tmp_path, steps=120, max_age=20)
    for _ in range(30):
        payoff.timing.observe(1.5)
    published = {"event": RunEvent.REFRESH, "outcome": "published", "role": "x", "started": 0.0}
    damaged = [
        {"seconds": -50.0},
        {"seconds": float("inf")},
        {"seconds": 1.0, "start_seconds": 9.0},
    ]
    path = tmp_path / LOG_FILE
    path.write_text("".join(json.dumps({**published, **fields}) + "\n" for fields in damaged))
    with caplog.at_level(logging.WARNING, logger="hnce.cluster.stores.refresh_log"):
        unknown = payoff.decide(30, _drawn(30))
    assert (unknown.reason, unknown.refresh_seconds) == ("unknown cost", None)
    named = [message for message in caplog.messages if "not a refresh record" in message]
    why = ["greater than or equal to 0", "a finite number", "start_seconds 9.0 exceed"]
    assert len(named) == 3 and all(
        message.startswith(f"{path}:{n}: ") and reason in message
        for n, message, reason in zip((1, 2, 3), named, why, strict=True)
    ), named
    _published(tmp_path, 60.0)
    assert payoff.decide(30, _drawn(30)).refresh_seconds == 60.0


def test_before_any_refresh_the_cost_is_the_initial_negatives(tmp_path: Path) -> None:
    """Before a refresh has published, R is the starting model's initial negatives (their event's
    seconds; a failed one does not count, nor one that encoded nothing, its index taken over
    from an evaluation): 90 s at 1.5 s a step is 60 steps."""
    log = EventLog(tmp_path)
    log.write(RunEvent.INITIAL_NEGATIVES, initial="model", seconds=90.0, encoded=True)
    log.write(RunEvent.INITIAL_NEGATIVES, initial="model", seconds=5.0, error="OSError: full")
    log.write(RunEvent.INITIAL_NEGATIVES, initial="model", seconds=3.0, encoded=False)
    payoff = _payoff(tmp_path, steps=120, max_age=20)
    for _ in range(10):
        payoff.timing.observe(1.5)
    late = payoff.decide(30, _drawn(30))  # 90 left: 30 after it lands, not 60
    assert (late.reason, late.refresh_seconds, late.cost_source, late.latency_steps) == (
        "late",
        90.0,
        "initial negatives",
        60.0,
    )
    assert payoff.decide(0, _drawn(30)).reason == "pays"


def test_a_refresh_is_charged_the_steps_it_slows_beside_it(tmp_path: Path) -> None:
    """On shared cores (a prior slowdown of 2: the trainer's 2 threads drop to 1 beside a
    refresh) a 60 s refresh at 1.5 s a step (L = 40) also costs D = 40 · (1 - 1/2) = 20 steps,
    so it pays only with 40 + 20 steps to train on after it lands; where the encoders have their
    own cores (1) the old bound of 40 holds. Once a refresh has run beside logged steps, the
    slowdown measured there replaces the prior."""
    record = RefreshRecord("published", "training coordinator", started=0.0, seconds=60.0)
    record.checkpoint = 10
    append_record(tmp_path, record)
    shared = _payoff(tmp_path, steps=120, max_age=20, slowdown_prior=2.0)
    own = _payoff(tmp_path, steps=120, max_age=20)
    for payoff in (shared, own):
        for _ in range(30):
            payoff.timing.observe(1.5, ended=10_000.0)  # after the refresh's window [0, 60]
    pays = shared.decide(20, _drawn(30))  # 100 left: 60 after it lands
    assert (pays.reason, pays.latency_steps, pays.lost_steps, pays.slowdown) == (
        "pays",
        40.0,
        20.0,
        2.0,
    )
    assert not pays.slowdown_measured and "from its threads" in pays.describe()
    assert shared.decide(21, _drawn(30)).reason == "late"  # 59 < 60
    assert own.decide(21, _drawn(30)).reason == "pays"  # 59 >= 40
    # steps that ended inside the refresh's window took 2.25 s against 1.5 s: 1.5x measured
    for _ in range(30):
        shared.timing.observe(2.25, ended=30.0)
    measured = shared.decide(21, _drawn(30))
    assert measured.slowdown == pytest.approx(1.5) and measured.slowdown_measured
    assert measured.lost_steps == pytest.approx(measured.latency_steps / 3)
    assert "1.50x slower beside it, measured" in measured.describe()


def test_the_summary_says_where_the_hard_negatives_came_from(tmp_path: Path) -> None:
    """A run that switched to no negatives version drew its hard negatives from the negative
    cache, if it drew any; a run that drew none trained on random negatives only."""
    cached = TrainingSummary(
        tmp_path, steps=120, final_loss=0.03, seconds=190.0, hard_negatives=3840
    )
    assert cached.line().endswith("0 refreshes, 3,840 hard negatives from the negative cache")
    plain = TrainingSummary(tmp_path, steps=120, final_loss=0.002, seconds=190.0)
    assert plain.line().endswith("0 refreshes, random negatives only")
