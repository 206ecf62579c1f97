"""A refresh under the run's lock, once (cron, ``ray job submit``) or on a schedule (docs/refresh.md).

:func:`attempt_refresh` is the one way a refresh runs, for the stand-alone ``hnce refresh`` and
for the coordinator inside training alike: it looks, without the lock and without Ray, whether
the live index and negatives already come from the checkpoint (then it starts nothing), takes
the run's cluster-wide :class:`hnce.cluster.compute.lock.RunLock`, looks again under it, runs
:func:`hnce.cluster.compute.refresh.engine.run_refresh`, and returns a
:class:`hnce.cluster.stores.refresh_log.RefreshRecord` (appended to the run's refresh log when it ran). The training coordinator's refreshes start only,
and go on only, while a refresh as fast as the run's fastest would publish before the end of
training that the newest checkpoint expects (:func:`publishes_late`).

:func:`refresh_every` keeps a fixed cadence: slot k starts at ``first + k * interval``; a refresh
that overruns its slots skips them (``missed_slots``) instead of pushing every later start.
SIGTERM (:class:`StopRequest`; ``ray job stop`` and Kubernetes send it) ends the job cleanly
between refreshes (exit 0); during a refresh, the refresh is abandoned within a batch of
encoding: finished shards stay recorded, nothing half-written is published, and the next
refresh resumes it (exit 143). A refresh already mining its negatives finishes first.

Exit codes of ``hnce refresh``: 0 published or up to date (or stopped between refreshes), 2 bad
input (also :data:`~hnce.cluster.compute.refresh.health.MAX_FAILURES_IN_A_ROW` failures in a row of ``--every``), 3 no complete
checkpoint, 75 another refresh holds the lock (EX_TEMPFAIL), 143 abandoned on SIGTERM.
"""

from __future__ import annotations

import logging
import math
import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

from hnce.cluster.compute.actors import StopRequested
from hnce.cluster.compute.encoder_pool import KeptPool
from hnce.cluster.compute.lock import RunLock
from hnce.cluster.compute.refresh.engine import NoCheckpointError, run_refresh
from hnce.cluster.compute.refresh.health import MAX_FAILURES_IN_A_ROW, RefreshesFailing
from hnce.cluster.compute.refresh.plan import RefreshPlan
from hnce.cluster.stores.checkpoints import (
    checkpoints_root,
    complete_checkpoints,
    newest_checkpoint,
    refresh_requests,
    training_ends_at,
)
from hnce.cluster.stores.lock_holder import EXIT_LOCKED, RunLocked
from hnce.cluster.stores.refresh_log import (
    RefreshRecord,
    append_heldout,
    append_record,
    fastest_refresh_seconds,
    read_log,
)
from hnce.errors import InputError

logger = logging.getLogger(__name__)

JOB_ROLE = "hnce refresh"
NO_MORE_REFRESHES = "no refresh any more"  # the coordinator's refreshes would all publish late
EXIT_OK = 0
EXIT_NO_CHECKPOINT = 3
EXIT_ABANDONED = 128 + signal.SIGTERM
_EXIT_CODES = {
    "published": EXIT_OK,
    "up-to-date": EXIT_OK,
    "no-checkpoint": EXIT_NO_CHECKPOINT,
    "locked": EXIT_LOCKED,
    "abandoned": EXIT_ABANDONED,
}
_INTERVAL = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_SECONDS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_interval(text: str) -> float:
    """Seconds in an interval like `6h`, `30m`, `90s`, `1d` or `45` (seconds)."""
    match = _INTERVAL.match(text)
    if not match or float(match.group(1)) <= 0:
        raise InputError(f"bad interval {text!r}: expected a positive number with s, m, h or d")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def refresh_target(
    plan: RefreshPlan, step: int | None = None, requests_only: bool = False
) -> tuple[int, bool]:
    """The checkpoint a refresh would publish (``step``, else the newest complete one, or with
    ``requests_only`` the newest that asks for a refresh: the training coordinator's choice,
    ``refresh.trigger``) and whether that is still to do (False when the live index and
    negatives come from it, or, for ``requests_only``, from a newer checkpoint: a stand-alone
    ``hnce refresh`` got there first, and the coordinator never goes back).

    Reads manifests only (no Ray, no model). Raises NoCheckpointError before the first
    checkpoint (or request), or when ``step`` is not a complete checkpoint of the run.
    """
    checkpoints = complete_checkpoints(plan.run_dir)
    if not checkpoints:
        raise NoCheckpointError(f"{checkpoints_root(plan.run_dir)}: no complete checkpoint")
    if step is None and requests_only:
        requests = refresh_requests(checkpoints)
        if not requests:
            raise NoCheckpointError(
                f"{checkpoints_root(plan.run_dir)}: no checkpoint asks for a refresh (yet, "
                f"or any more: the newest says none would publish before training ends)"
            )
        late = publishes_late(plan, time.time())
        if late is not None:
            raise NoCheckpointError(
                f"{checkpoints_root(plan.run_dir)}: {NO_MORE_REFRESHES}: {late}"
            )
        step = requests[-1][0]
    target = checkpoints[-1][0] if step is None else step
    if target not in {found for found, _ in checkpoints}:
        steps = ", ".join(f"step-{found}" for found, _ in checkpoints)
        raise NoCheckpointError(
            f"{checkpoints_root(plan.run_dir)}: no complete checkpoint step-{target} (complete: "
            f"{steps})"
        )
    index_store = plan.index_store
    live = index_store.current_version()
    live_checkpoint = None if live is None else index_store.read_manifest(live)["checkpoint"]
    if requests_only and live_checkpoint is not None and live_checkpoint > target:
        return target, False
    if live_checkpoint != target:
        return target, True
    return target, plan.negatives_store.current_version() != live


def publishes_late(plan: RefreshPlan, started: float) -> str | None:
    """Why a training coordinator's refresh started at ``started`` would publish after its
    training run's last step, or None: the run's fastest published refresh
    (:func:`hnce.cluster.stores.refresh_log.fastest_refresh_seconds`) takes it past the end
    that the newest checkpoint expects (:func:`hnce.cluster.stores.checkpoints.training_ends_at`).
    ANCE's asynchronous refresh (Xiong et al. 2021, §3.2) pays for its pass over the catalogue
    with the steps trained on its negatives: a version published after the last step buys none
    and holds the cores the trainer would have
    (:mod:`hnce.cluster.compute.refresh.modes.asynchronous`).
    None while either figure is unknown."""
    newest = newest_checkpoint(plan.run_dir)
    ends_at = None if newest is None else training_ends_at(newest[1])
    fastest = fastest_refresh_seconds(read_log(plan.run_dir).records)
    if ends_at is None or fastest is None or started + fastest < ends_at:
        return None
    return (
        f"one started at {started:.0f} would publish at {started + fastest:.0f} at the earliest "
        f"(the run's fastest refresh took {fastest:.0f} s), after the end of training that "
        f"step-{newest[0]} expects at {ends_at:.0f}"
    )


def attempt_refresh(
    plan: RefreshPlan,
    role: str,
    step: int | None = None,
    connect: Callable[[], None] | None = None,
    stopping: Callable[[], bool] = lambda: False,
    failures: int = 0,
    requests_only: bool = False,
    kept: KeptPool | None = None,
) -> RefreshRecord:
    """One refresh of ``step`` (default: the newest checkpoint; with ``requests_only`` the
    newest that asks for a refresh, :func:`refresh_target`) under the run's lock.

    ``connect`` (starting or joining Ray) runs only once there is something to do and the lock
    file is held. ``stopping`` is asked after every indexed shard; when true, the refresh is
    abandoned there. ``failures``: the caller's failures in a row before this attempt. ``kept``:
    the caller's encoder pool, kept between refreshes (None: one pool for this refresh). A failed
    refresh is returned as a record carrying the exception; nothing is raised for it.
    """
    record = RefreshRecord("up-to-date", role, time.time(), consecutive_failures=failures)
    try:
        if _worth_locking(plan, step, requests_only, record):
            with RunLock(plan.run_dir, role, connect) as lock:
                _run_locked(plan, step, requests_only, record, lock, stopping, kept)
    except RunLocked as error:
        record.outcome, record.message = "locked", str(error)
    except NoCheckpointError as error:
        record.outcome, record.message = "no-checkpoint", str(error)
    if record.outcome == "up-to-date" and not record.message:
        record.message = f"step-{record.checkpoint} is already live; nothing to do"
    return record


def _worth_locking(
    plan: RefreshPlan, step: int | None, requests_only: bool, record: RefreshRecord
) -> bool:
    """Whether a refresh may have work: its checkpoint is not live yet, or the check itself
    failed (it is made again under the lock, where a failure is recorded in the run's log)."""
    try:
        record.checkpoint, due = refresh_target(plan, step, requests_only)
    except NoCheckpointError:
        raise
    except Exception:
        return True
    return due


def _run_locked(
    plan: RefreshPlan,
    step: int | None,
    requests_only: bool,
    record: RefreshRecord,
    lock: RunLock,
    stopping: Callable[[], bool],
    kept: KeptPool | None,
) -> None:
    """Under the lock: choose the checkpoint again, refresh it, fill in and log the record
    (after its held-out recall, when the refresh scored one).

    The record's interval (``started``, ``seconds``) lies within the lock's tenure.
    """
    record.started = time.time()
    late: list[str] = []  # why a training coordinator's refresh stopped: it would publish late

    def stops() -> bool:
        if stopping():
            return True
        reason = publishes_late(plan, record.started) if requests_only else None
        late[:] = [] if reason is None else [reason]
        return reason is not None

    try:
        record.checkpoint, due = refresh_target(plan, step, requests_only)
        if not due:
            return
        lock.encoding(record.checkpoint)
        summary = run_refresh(plan, record.checkpoint, stopping=stops, kept=kept)
    except StopRequested as error:
        record.outcome = "abandoned"
        cause = f"it would publish after training ends: {late[0]}" if late else str(error)
        record.message = (
            f"refresh of step-{record.checkpoint} abandoned ({cause}); its finished shards are "
            f"recorded and the next refresh resumes them"
        )
    except NoCheckpointError:
        raise  # pruned since it was chosen: reported as no-checkpoint by the caller
    except Exception as error:
        record.outcome, record.error = "failed", error
        record.consecutive_failures += 1
        record.message = f"{type(error).__name__}: {error}"
        logger.error("refresh of step-%s failed: %s", record.checkpoint, record.message)
    else:
        record.outcome = "up-to-date" if summary.up_to_date else "published"
        record.index_version = summary.index_version
        record.negatives_version = summary.negatives_version
        record.consecutive_failures, record.message = 0, summary.line()
        record.start_seconds = summary.seconds.get("start", 0.0)
        if summary.heldout is not None:
            append_heldout(plan.run_dir, summary.heldout)
    record.seconds = time.time() - record.started
    try:
        append_record(plan.run_dir, record)
    except OSError as unrecorded:  # a full disk: the refresh's own error is the one reported
        if record.error is None:
            raise
        logger.error("the failed refresh is not in the refresh log: %s", unrecorded)


class StopRequest:
    """SIGTERM sets :attr:`event`: a scheduled job then stops between refreshes, and a refresh
    in progress is abandoned within a batch.

    ``ray.init`` installs its own SIGTERM handler in a driver, so :meth:`install` again after
    connecting to Ray. Signal handlers can only be installed from the main thread.
    """

    def __init__(self) -> None:
        self.event = threading.Event()

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        logger.info("SIGTERM: stopping (a refresh in progress stops within a batch)")
        self.event.set()


def refresh_once(
    plan: RefreshPlan,
    step: int | None = None,
    connect: Callable[[], None] | None = None,
    stop: threading.Event | None = None,
    report: Callable[[str], None] = print,
) -> int:
    """One refresh; reports its record as one JSON line and returns the exit code.

    A failed refresh raises its error after reporting (one line for bad input, else a traceback).
    """
    stop = stop or threading.Event()
    record = attempt_refresh(plan, JOB_ROLE, step, connect, stop.is_set)
    report(record.json_line())
    if record.error is not None:
        raise record.error
    return _EXIT_CODES[record.outcome]


@dataclass(frozen=True)
class Cadence:
    """Slot k starts at ``first + k * interval`` (seconds since the epoch)."""

    first: float
    interval: float

    def start(self, slot: int) -> float:
        return self.first + slot * self.interval

    def following(self, slot: int, now: float) -> int:
        """The first slot after ``slot`` that has not started by ``now``."""
        return max(slot + 1, math.ceil((now - self.first) / self.interval))


def refresh_every(
    plan: RefreshPlan,
    interval_seconds: float,
    connect: Callable[[], None] | None = None,
    stop: threading.Event | None = None,
    report: Callable[[str], None] = print,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], bool] | None = None,
) -> int:
    """Refresh at a fixed cadence until ``stop`` is set (SIGTERM); returns the exit code.

    Each run reports one JSON line (a locked or up-to-date run is a line too, and the schedule
    goes on). :data:`~hnce.cluster.compute.refresh.health.MAX_FAILURES_IN_A_ROW` failures in a row raise
    :class:`RefreshesFailing`. ``sleep(seconds)`` waits and returns True when stopped
    (default: ``stop.wait``); tests pass a fake clock and sleep.
    """
    stop = stop or threading.Event()
    sleep = sleep or stop.wait
    cadence = Cadence(clock(), interval_seconds)
    slot = missed = failures = 0
    while not sleep(max(0.0, cadence.start(slot) - clock())):
        record = attempt_refresh(plan, JOB_ROLE, None, connect, stop.is_set, failures)
        record.scheduled, record.missed_slots = cadence.start(slot), missed
        report(record.json_line())
        if record.outcome == "abandoned":
            return EXIT_ABANDONED
        if record.outcome in ("published", "up-to-date", "failed"):
            failures = record.consecutive_failures
        if failures >= MAX_FAILURES_IN_A_ROW:
            raise RefreshesFailing.after(record, f"hnce refresh --every of {plan.run_dir}")
        following = cadence.following(slot, clock())
        slot, missed = following, following - slot - 1
    report(
        RefreshRecord("stopped", JOB_ROLE, clock(), message="SIGTERM between refreshes").json_line()
    )
    return EXIT_OK
