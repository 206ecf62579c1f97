"""The trainer's watch over the run's refreshes: failures are loud, and too many stop training.

The refresh coordinator records every refresh it runs in ``<run>/refresh_log.jsonl``
(:mod:`hnce.cluster.stores.refresh_log`). Whenever the workers look for a newer negatives version, rank 0
also reads the refreshes recorded since it last looked (:class:`RefreshHealth`):

- each failure is written at once to the trainer's event log as a ``refresh_failed`` event
  (step, checkpoint, failures in a row, error), each published refresh as a ``refresh`` event
  (step, checkpoint, versions, seconds: the refresh duration that TensorBoard shows), and each
  held-out recall a refresh scored as a ``heldout_recall`` event at the checkpoint's step (and
  so as TensorBoard's ``heldout/recall@k``);
- when one reaches ``refresh.max_consecutive_failures`` failures in a row, rank 0 writes a
  ``refresh_stop`` event naming the failing checkpoint and cause, and every rank leaves the
  training loop at that same step (the decision is broadcast).

The workers return normally, so Ray Train does not restart them into the same failures: the stop
is final. The driver then raises :class:`hnce.cluster.compute.refresh_job.RefreshesFailing` with the cause
(:func:`raise_if_stopped`). Only refreshes that finished after the worker started count, so a
resumed run is not stopped by the failures of an earlier one.

A refresh still running when training ends records its held-out recall after rank 0 last looked;
once the coordinator has stopped, the driver copies every held-out recall of the refresh log that
the event log lacks (:func:`log_missed_heldout`), so the last one reaches TensorBoard too.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

from hnce.cluster.compute.refresh_job import RefreshesFailing
from hnce.cluster.stores.refresh_log import HeldoutRecall, RefreshRecord, read_log
from hnce.events import RunEvent
from hnce.pipeline.event_log import EventLog, read_events


class RefreshHealth:
    """Follows the run's refresh log from one worker; see the module docs."""

    def __init__(self, run_dir: Path, max_consecutive_failures: int, rank: int) -> None:
        self.run_dir = Path(run_dir)
        self.max_consecutive_failures = max_consecutive_failures
        self.rank = rank
        self.since = time.time()
        self._offset = 0

    def should_stop(self, step: int, log: EventLog | None, device: torch.device) -> bool:
        """Log new refresh failures; True on every rank when training must stop at ``step``.

        Collective over the process group when one is initialised (all ranks must call it).
        """
        cause = self._read(step, log) if self.rank == 0 else None
        stop = torch.tensor([0 if cause is None else 1], dtype=torch.long, device=device)
        if dist.is_available() and dist.is_initialized():
            dist.broadcast(stop, src=0)
        if log is not None and cause is not None:
            log.write(RunEvent.REFRESH_STOP, step=step, cause=cause)
        return bool(stop.item())

    def _read(self, step: int, log: EventLog | None) -> str | None:
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
            if failing and record.consecutive_failures >= self.max_consecutive_failures:
                cause = str(RefreshesFailing.after(record, f"training stopped at step {step}"))
        return cause

    @staticmethod
    def _log(record: RefreshRecord, step: int, log: EventLog) -> None:
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


def _log_heldout(heldout: HeldoutRecall, log: EventLog) -> None:
    """``heldout`` as a ``heldout_recall`` event, at the time it was scored (not copied)."""
    log.write(RunEvent.HELDOUT_RECALL, **asdict(heldout))


def log_missed_heldout(run_dir: Path) -> int:
    """Copy every held-out recall of the run's refresh log that its event log lacks into the
    event log and TensorBoard; returns how many. The driver's call once the launch's refresh
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
        log = EventLog(run_dir, tensorboard=True)
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
