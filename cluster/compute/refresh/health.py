"""The trainer's watch over the run's refreshes: failures are loud, and too many stop training.

The refresh coordinator records every refresh it runs in ``<run>/refresh_log.jsonl``
(:mod:`hnce.cluster.stores.refresh_log`). Whenever the workers look for a newer negatives version, rank 0
also reads the refreshes recorded since it last looked (:class:`RefreshHealth`):

- each failure is written at once to the trainer's event log as a ``refresh_failed`` event
  (step, checkpoint, failures in a row, error), each published refresh as a ``refresh`` event
  (step, checkpoint, versions, seconds: the refresh duration that TensorBoard shows), and each
  held-out recall a refresh scored as a ``heldout_recall`` event at the checkpoint's step (and
  so as TensorBoard's ``heldout/recall@k``);
- when one reaches :data:`MAX_FAILURES_IN_A_ROW` failures in a row, rank 0 writes a
  ``refresh_stop`` event naming the failing checkpoint and cause, and every rank leaves the
  training loop at that same step (the decision is broadcast).

The workers return normally, so Ray Train does not restart them into the same failures: the stop
is final. The driver then raises :class:`RefreshesFailing` with the cause
(:func:`raise_if_stopped`). Only refreshes that finished after the worker started count, so a
resumed run is not stopped by the failures of an earlier one.

A refresh still running when training ends records its held-out recall after rank 0 last looked;
once the coordinator has stopped, the driver copies every held-out recall of the refresh log that
the event log lacks (:func:`log_missed_heldout`), so the last one reaches TensorBoard too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Protocol

from hnce.cluster.compute.refresh.policy import EventSink, Ranks
from hnce.cluster.stores.refresh_log import HeldoutRecall, RefreshRecord, read_log
from hnce.cluster.stores.run_events import read_events
from hnce.errors import InputError
from hnce.events import RunEvent

#: refreshes in a row that may fail before training (or ``hnce refresh --every``) stops: one or
#: two failures may be a lost node or actor that Ray replaces; three in a row have a cause that
#: repeating does not fix (bad input, a full disk), which the operator must
MAX_FAILURES_IN_A_ROW = 3


class RefreshesFailing(InputError):
    """:data:`MAX_FAILURES_IN_A_ROW` refreshes of a run failed in a row.

    Raised where repeating cannot help (a scheduled job, a training run); the message names the
    last failing checkpoint and its cause, which the operator fixes before running again.
    """

    @classmethod
    def after(cls, record: RefreshRecord, where: str) -> RefreshesFailing:
        return cls(
            f"{where}: {record.consecutive_failures} refreshes in a row failed; the last, of "
            f"step-{record.checkpoint}: {record.message}"
        )


class ClosableSink(EventSink, Protocol):
    """An event sink to close once written (the driver's TensorBoard file)."""

    def close(self) -> None: ...


class RefreshHealth:
    """Follows the run's refresh log from one worker; see the module docs."""

    def __init__(self, run_dir: Path, ranks: Ranks) -> None:
        self.run_dir = Path(run_dir)
        self.ranks = ranks
        self.since = time.time()
        self._offset = 0

    def should_stop(self, step: int, log: EventSink | None) -> bool:
        """Log new refresh failures; True on every rank when training must stop at ``step``
        (a collective: every rank calls it)."""
        cause = self._read(step, log) if self.ranks.rank == 0 else None
        stop = bool(self.ranks.broadcast_int(0 if cause is None else 1))
        if log is not None and cause is not None:
            log.write(RunEvent.REFRESH_STOP, step=step, cause=cause)
        return stop

    def _read(self, step: int, log: EventSink | None) -> str | None:
        """Rank 0: log the refreshes published and failed and the held-out recalls scored since
        the last call (a recall at the step of the checkpoint it scored); the stop cause, if any."""
        found = read_log(self.run_dir, self._offset)
        self._offset = found.offset
        for heldout in found.heldout:
            if log is not None and heldout.time >= self.since:
                _log_heldout(heldout, log)
        cause = None
        for record in found.records:
            if record.finished < self.since:
                continue
            if log is not None:
                self._log(record, step, log)
            failing = record.outcome == "failed"
            if failing and record.consecutive_failures >= MAX_FAILURES_IN_A_ROW:
                cause = str(RefreshesFailing.after(record, f"training stopped at step {step}"))
        return cause

    @staticmethod
    def _log(record: RefreshRecord, step: int, log: EventSink) -> None:
        """A published refresh as a ``refresh`` event, a failed one as ``refresh_failed``."""
        if record.outcome == "published":
            log.write(
                RunEvent.REFRESH,
                step=step,
                checkpoint=record.checkpoint,
                index_version=record.index_version,
                negatives_version=record.negatives_version,
                seconds=record.seconds,
            )
        elif record.outcome == "failed":
            log.write(
                RunEvent.REFRESH_FAILED,
                step=step,
                checkpoint=record.checkpoint,
                consecutive=record.consecutive_failures,
                error=record.message,
            )


def _log_heldout(heldout: HeldoutRecall, log: EventSink) -> None:
    """``heldout`` as a ``heldout_recall`` event, at the time it was scored (not copied)."""
    log.write(RunEvent.HELDOUT_RECALL, **asdict(heldout))


def log_missed_heldout(run_dir: Path, open_log: Callable[[], ClosableSink]) -> int:
    """Copy every held-out recall of the run's refresh log that its event log lacks into the
    log ``open_log()`` opens (the event log and TensorBoard); returns how many. The driver's call once the launch's refresh
    coordinator has stopped (no refresh of the launch can record one after it, and no worker
    writes TensorBoard any more).

    A recall is identified by its checkpoint step, index version and scoring time, so a second
    call copies nothing: a recall the trainer copied, or an earlier call, is never written twice.
    """
    recalls = read_log(run_dir).heldout
    if not recalls:
        return 0
    logged = {
        (event.get("step"), event.get("index_version"), event.get("time"))
        for event in read_events(run_dir, RunEvent.HELDOUT_RECALL)
    }
    missed = [h for h in recalls if (h.step, h.index_version, h.time) not in logged]
    if missed:
        log = open_log()
        try:
            for heldout in missed:
                _log_heldout(heldout, log)
        finally:
            log.close()
    return len(missed)


def raise_if_stopped(run_dir: Path, since: float) -> None:
    """Raise :class:`RefreshesFailing` when the workers stopped training for failing refreshes
    (a ``refresh_stop`` event at or after ``since``, the driver's start)."""
    stops = [
        event for event in read_events(run_dir, RunEvent.REFRESH_STOP) if event["time"] >= since
    ]
    if stops:
        raise RefreshesFailing(stops[-1]["cause"])
