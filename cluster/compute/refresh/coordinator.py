"""The refresh coordinator: a Ray actor that refreshes a run as its checkpoints appear (docs/refresh.md).

The trainer starts one per run (:mod:`hnce.cluster.compute.refresh.supervisor`); its loop asks
every :data:`POLL_SECONDS` whether the newest complete checkpoint that asks for a refresh is live
(which checkpoints ask is the trigger's choice, :mod:`hnce.cluster.compute.refresh.triggers`;
:func:`hnce.cluster.stores.checkpoints.wants_refresh`), and if not refreshes it
through :func:`hnce.cluster.compute.refresh.job.attempt_refresh`, under the same run lock as ``hnce
refresh`` (a lagging refresh therefore always jumps to the newest checkpoint, skipping stale
ones). A refresh held off by another holder of the lock waits for the next poll; a failed one is
logged at once and recorded in the run's refresh log, where the trainer sees it
(:mod:`hnce.cluster.compute.refresh.health`). Its encoder actors take their own CPUs or GPUs; the
coordinator itself takes no CPU slot.

Stopping is two-step, so that a normal end prints no Ray task failure: :meth:`stop` ends the
loop after the refresh in progress, :meth:`abandon` also stops that refresh within a batch
(resumable); the caller waits for :meth:`watch` to return and only then lets the idle
actor go.

Example (inside a Ray job)::

    coordinator = RefreshCoordinator.remote(RefreshPlan(run_dir, data_dir, refresh, index))
    watch = coordinator.watch.remote()            # runs until coordinator.stop.remote()
"""

from __future__ import annotations

import logging
import threading

import ray

from hnce.cluster.compute.encoder_pool import KeptPool
from hnce.cluster.compute.refresh.health import MAX_FAILURES_IN_A_ROW
from hnce.cluster.compute.refresh.job import NO_MORE_REFRESHES, attempt_refresh
from hnce.cluster.compute.refresh.plan import RefreshPlan
from hnce.cluster.stores.refresh_log import RefreshRecord

logger = logging.getLogger(__name__)

COORDINATOR_ROLE = "training coordinator"
#: how often the coordinator looks for a newer checkpoint that asks for a refresh: a look reads
#: a few small manifests, far less than a refresh costs, so a refresh starts within half a second
#: of its checkpoint at no measurable price (tests shorten it no further)
POLL_SECONDS = 0.5


@ray.remote(max_restarts=3, max_task_retries=3, num_cpus=0, max_concurrency=4)
class RefreshCoordinator:
    """Ray actor that refreshes whenever a newer complete checkpoint appears.

    Restarted by Ray if it dies; a restarted refresh resumes from the recorded shards. Runs its
    loop in a thread so `stop`, `abandon` and `status` calls are served meanwhile.
    """

    def __init__(self, plan: RefreshPlan) -> None:
        self.plan = plan
        self._stop = threading.Event()
        self._abandon = threading.Event()
        self.tally = RefreshTally()
        self.kept = KeptPool()

    def watch(self) -> int:
        """Refresh each time a newer checkpoint is complete, until `stop`, on one encoder pool
        kept from refresh to refresh (:class:`hnce.cluster.compute.encoder_pool.KeptPool`);
        after :data:`MAX_FAILURES_IN_A_ROW` failures in a row, tries no more (training stops on
        them); returns refreshes published."""
        try:
            while not self._stop.is_set():
                record = attempt_refresh(
                    self.plan,
                    COORDINATOR_ROLE,
                    stopping=self._abandon.is_set,
                    failures=self.tally.failures_in_a_row,
                    requests_only=True,
                    kept=self.kept,
                )
                self.tally.note(record)
                if self.tally.failures_in_a_row >= MAX_FAILURES_IN_A_ROW:
                    # the trainer stops at its next look at the refresh log (refresh.health);
                    # another try of the same failing refresh would only add to the count
                    self._stop.wait()
                self._stop.wait(POLL_SECONDS)
        finally:
            self.kept.close()
        return self.tally.published

    def stop(self) -> None:
        """End the loop once the refresh in progress (if any) is done."""
        self._stop.set()

    def abandon(self) -> None:
        """Also stop the refresh in progress within a batch (it stays resumable)."""
        self._stop.set()
        self._abandon.set()

    def status(self) -> dict[str, object]:
        """:meth:`RefreshTally.status` of this coordinator's refreshes."""
        return self.tally.status()


class RefreshTally:
    """What a coordinator's refreshes came to: counters for ``status`` and a log line for each
    outcome worth an operator's attention, once per change rather than once per poll."""

    def __init__(self) -> None:
        self.last: RefreshRecord | None = None
        self.published = 0
        self.failed = 0
        self.failures_in_a_row = 0
        self.last_error: str | None = None
        self.locked_by: str | None = None
        self.refreshes_over: str | None = None

    def note(self, record: RefreshRecord) -> None:
        """Count ``record`` and log it: a wait on another holder of the lock when the holder
        changes, every failure and abandoned refresh, and the first poll on which refreshing
        is over because any refresh would publish after training ends (``NO_MORE_REFRESHES``)."""
        if record.outcome == "locked":
            if record.message != self.locked_by:
                logger.info("refresh waits: %s", record.message)
            self.locked_by = record.message
            return
        self.locked_by = None
        if record.outcome == "no-checkpoint" and NO_MORE_REFRESHES in record.message:
            if self.refreshes_over is None:
                logger.info("refreshes end here: %s", record.message)
            self.refreshes_over = record.message
        if record.outcome in ("published", "failed", "abandoned"):
            self.last = record
            self.failures_in_a_row = record.consecutive_failures
        if record.outcome == "published":
            self.published += 1
        elif record.outcome == "abandoned":
            logger.info("%s", record.message)
        elif record.outcome == "failed":
            self.failed += 1
            self.last_error = f"step-{record.checkpoint}: {record.message}"
            logger.error(
                "refresh of step-%s failed (%d in a row): %s",
                record.checkpoint,
                record.consecutive_failures,
                record.message,
            )

    def status(self) -> dict[str, object]:
        """Refreshes published and failed, the last error and refresh that ran, who holds the
        lock if the coordinator waits, and why refreshing is over if it is."""
        return {
            "refreshes": self.published,
            "failed": self.failed,
            "error": self.last_error,
            "failures_in_a_row": self.failures_in_a_row,
            "last": None if self.last is None else self.last.to_json(),
            "locked_by": self.locked_by,
            "refreshes_over": self.refreshes_over,
        }
