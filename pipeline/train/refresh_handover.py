"""A worker's side of the run's refreshes: when it looks for newer negatives, when it waits for
them, and what each checkpoint it publishes asks of the refresh coordinator (docs/refresh.md).

(``training.cores: handover``, the trainer's cores handed to a running refresh, is another
thing: :mod:`hnce.pipeline.train.cores`.)

- Looking: every ``negatives_check_every`` steps, and at the first step of a (re)start, every
  rank switches to the newest published negatives version without waiting, and rank 0 reads
  the refresh log (:class:`~hnce.pipeline.train.refresh_health.RefreshHealth`: too many
  failures in a row stop every rank at the same step).
- Waiting: with ``refresh.mode: sync``, at every ``sync_every`` steps until the negatives mined
  with that step's checkpoint are live (a ``refresh_wait`` event); before the first step, for
  negatives version 0 when the driver prepares it beside the workers' start (an
  ``initial_negatives_wait`` event; :mod:`hnce.pipeline.train.version_zero`).
- Asking: which steps publish a checkpoint, and what each checkpoint's state tells the
  coordinator: whether it asks for a refresh (every one by default; with ``refresh.trigger:
  stale`` those of stale negatives, :class:`~hnce.pipeline.train.staleness.StalenessMonitor`;
  with ``refresh.trigger: payoff`` those whose refresh pays, from the age of the hard negatives
  drawn since the previous checkpoint, :meth:`~hnce.pipeline.train.refresh_payoff.RefreshPayoff.decide`;
  with sync those training waits for), whether the run's refreshes have ended and when training
  is expected to end (:class:`~hnce.pipeline.train.refresh_payoff.RefreshPayoff`).

Every decision that changes what the ranks do is rank 0's, broadcast, so that every rank makes
the same collective calls.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Protocol

from hnce.cluster.stores.checkpoints import REFRESH_REQUEST, REFRESHES_END, TRAINING_ENDS_AT
from hnce.events import RunEvent
from hnce.pipeline.config import Config
from hnce.pipeline.event_log import EventLog
from hnce.pipeline.train.distributed import Collectives
from hnce.pipeline.train.negative_cache import NegativeFreshness
from hnce.pipeline.train.negatives import CandidateSource
from hnce.pipeline.train.refresh_health import RefreshHealth
from hnce.pipeline.train.refresh_payoff import RefreshPayoff
from hnce.pipeline.train.staleness import StalenessMonitor
from hnce.pipeline.train.task import TrainingTask
from hnce.pipeline.train.version_zero import initial_negatives_error

logger = logging.getLogger(__name__)


class NegativesInUse(Protocol):
    """What the hand-over reads and moves of a worker's negatives
    (:class:`~hnce.pipeline.train.negatives.TrainingData`): the version in use, and the switch
    to the newest one (a collective), and how old the vectors of the hard negatives drawn were."""

    source: CandidateSource
    freshness: NegativeFreshness

    def switch(self, step: int, log: EventLog | None) -> None: ...


class RefreshHandover:
    """One worker's side of one task's refreshes (module docs), over its ``negatives``;
    ``initial_negatives_since``: the start of the driver that prepares negatives version 0
    beside the workers' start-up, None when it is ready; ``slowdown_prior``: how much slower a
    step runs beside a refresh before one has been measured (the worker's threads without one
    over its threads beside one)."""

    def __init__(
        self,
        config: Config,
        task: TrainingTask,
        collectives: Collectives,
        log: EventLog | None,
        negatives: NegativesInUse,
        initial_negatives_since: float | None = None,
        slowdown_prior: float = 1.0,
    ) -> None:
        settings = task.settings(config)
        self.refresh = config.refresh
        self.steps = settings.steps
        self.check_every = settings.negatives_check_every
        self.checkpoint_every = settings.checkpoint_every
        self.run_dir = Path(task.run_dir)
        self.collectives = collectives
        self.log = log
        self.negatives = negatives
        self.initial_negatives_since = initial_negatives_since
        self.waits = task.waits_for_refreshes(config)
        refreshes = task.refreshes(config)
        self.health = (
            RefreshHealth(task.run_dir, self.refresh.max_consecutive_failures, collectives.rank)
            if refreshes
            else None
        )
        self.staleness = (
            StalenessMonitor(self.refresh.stale_loss_ratio, self.refresh.stale_window)
            if task.refreshes_when_stale(config)
            else None
        )
        self.payoff = (
            RefreshPayoff(task.run_dir, self.steps, slowdown_prior)
            if refreshes and not self.waits
            else None
        )
        self.drawn = negatives.freshness.window() if task.refreshes_when_it_pays(config) else None
        self.ended = False

    def _stops(self, step: int) -> bool:
        """Whether the refreshes failed too often: every rank stops at ``step``."""
        return self.health is not None and self.health.should_stop(
            step, self.log, self.collectives.device
        )

    def _synced(self, step: int) -> bool:
        """``refresh.mode: sync``: whether training waits at ``step`` for its refresh."""
        return self.waits and step % self.refresh.sync_every == 0

    def poll(self, step: int, first: bool = False) -> bool:
        """Before ``step`` (``first``: the first of this start): every ``negatives_check_every``
        steps, and at the first, switch to the newest negatives version and read the refresh
        log; with ``refresh.mode: sync`` at every ``sync_every`` steps wait for the negatives of
        that step's checkpoint (:meth:`wait_for_refresh`). True when the refreshes failed too
        often and every rank stops here."""
        sync = step > 0 and self._synced(step)
        if not sync and step % self.check_every != 0 and not first:
            return False
        self.negatives.switch(step, self.log)
        if sync:
            return self.wait_for_refresh(step)
        return self._stops(step)

    def wait_for_refresh(self, step: int) -> bool:
        """``refresh.mode: sync``: hold training at ``step`` until the negatives mined with the
        checkpoint of ``step`` are live (a ``refresh_wait`` event says how long it took); True
        when the refreshes failed too often meanwhile."""
        started = time.perf_counter()
        source = self.negatives.source
        while source.current is None or source.current.checkpoint_step < step:
            if self._stops(step):
                return True
            time.sleep(self.refresh.poll_seconds)
            self.negatives.switch(step, self.log)
        if self.log is not None:
            self.log.write(RunEvent.REFRESH_WAIT, step=step, seconds=time.perf_counter() - started)
        return False

    def wait_for_version_zero(self, step: int) -> bool:
        """When the driver prepares negatives version 0 beside the workers' start: hold the
        first step (``step``) until it is live (an ``initial_negatives_wait`` event says how
        long that took); True when the driver reports that it failed: every rank stands down
        without training, and the driver raises the error."""
        since = self.initial_negatives_since
        if since is None:
            return False
        started = time.perf_counter()
        source = self.negatives.source
        self.negatives.switch(step, self.log)
        while source.current is None:
            failed = self.collectives.rank == 0 and (
                initial_negatives_error(self.run_dir, since) is not None
            )
            if self.collectives.broadcast_int(int(failed)):
                return True
            time.sleep(self.refresh.poll_seconds)
            self.negatives.switch(step, self.log)
        if self.log is not None:
            seconds = time.perf_counter() - started
            self.log.write(RunEvent.INITIAL_NEGATIVES_WAIT, step=step, seconds=seconds)
        return False

    def after_step(self, step: int, loss: float, seconds: float) -> bool:
        """Record the step that ends at ``step`` (its ``loss`` and ``seconds``); True when the
        negatives went stale (:meth:`negatives_went_stale`)."""
        if self.payoff is not None:
            self.payoff.observe(seconds)
        return self.negatives_went_stale(step, loss)

    def negatives_went_stale(self, step: int, loss: float) -> bool:
        """``refresh.trigger: stale``: record ``step``'s loss and, every ``negatives_check_every``
        steps, whether rank 0 finds the negatives stale (broadcast: every rank publishes the
        checkpoint that asks for their refresh together; a ``stale`` event says why)."""
        if self.staleness is None:
            return False
        version = self.negatives.source.version
        self.staleness.observe(version, loss)
        if step % self.check_every != 0:
            return False
        stale = bool(self.collectives.broadcast_int(int(self.staleness.stale())))
        if stale:
            self.staleness.mark_requested()
            if self.log is not None:
                ratio = self.staleness.loss_ratio()
                self.log.write(RunEvent.STALE, step=step, version=version, loss_ratio=ratio)
        return stale

    def publishes_at(self, step: int) -> bool:
        """A checkpoint every ``checkpoint_every`` steps, at the end and, with
        ``refresh.mode: sync``, at every step the next refresh waits for."""
        return step % self.checkpoint_every == 0 or step == self.steps or self._synced(step)

    def asks_for_refresh(self, step: int, stale: bool) -> bool:
        """Whether the checkpoint of ``step`` asks the coordinator for a refresh: every one by
        default; with ``refresh.trigger: stale`` those of ``stale`` negatives; with ``payoff``
        those whose refresh pays (:meth:`refresh_pays`); with ``refresh.mode: sync`` those
        training waits for (every ``sync_every`` steps), so that each refresh runs while the
        trainer waits (:mod:`hnce.pipeline.train.cores`)."""
        if self.staleness is not None:
            return stale
        if self.drawn is not None:
            return self.refresh_pays(step)
        if self.waits:
            return step % self.refresh.sync_every == 0
        return True

    def refresh_pays(self, step: int) -> bool:
        """``refresh.trigger: payoff``: rank 0's decision for the checkpoint of ``step`` from the
        hard negatives it drew since the previous one (broadcast: every rank publishes the same
        request), logged as a ``refresh_decision`` event and a line with its numbers."""
        assert self.payoff is not None and self.drawn is not None
        decision = self.payoff.decide(step, self.drawn.take(), self.refresh.max_negative_age)
        refresh = bool(self.collectives.broadcast_int(int(decision.refresh)))
        if refresh:
            self.payoff.asked(step)
        if self.log is not None:
            self.log.write(RunEvent.REFRESH_DECISION, **dataclasses.asdict(decision))
            logger.info("%s", decision.describe())
        return refresh

    def refreshes_end(self, step: int) -> tuple[bool, float | None]:
        """Whether the checkpoint of ``step`` ends the run's asynchronous refreshes, rank 0's
        estimate (:mod:`hnce.pipeline.train.refresh_payoff`) broadcast, and when training is
        expected to end (seconds since the epoch; None when unknown): the coordinator abandons
        a refresh that would publish after it. The first checkpoint that ends them writes a
        ``refreshes_end`` event with the estimate."""
        if self.payoff is None:
            return False, None
        estimate = self.payoff.estimate(step)
        ends = bool(self.collectives.broadcast_int(int(estimate.ends)))
        if ends and not self.ended and self.log is not None:
            self.log.write(
                RunEvent.REFRESHES_END,
                step=step,
                refresh_seconds=estimate.refresh_seconds,
                seconds_left=estimate.seconds_left,
            )
            logger.info(
                "no refresh from step %d on: the fastest took %s s, training has %s s left",
                step,
                "?" if estimate.refresh_seconds is None else f"{estimate.refresh_seconds:.0f}",
                "?" if estimate.seconds_left is None else f"{estimate.seconds_left:.0f}",
            )
        self.ended |= ends
        if estimate.seconds_left is None:
            return ends, None
        return ends, time.time() + estimate.seconds_left

    def checkpoint_request(self, step: int, stale: bool = False) -> dict[str, Any]:
        """What the checkpoint of ``step`` tells the coordinator (its state's refresh entries):
        whether it asks for a refresh (:meth:`asks_for_refresh`, unless they ended), whether
        refreshes end (:meth:`refreshes_end`, a collective) and when training should end."""
        ends, ends_at = self.refreshes_end(step)
        return {
            REFRESH_REQUEST: not ends and self.asks_for_refresh(step, stale),
            REFRESHES_END: ends,
            TRAINING_ENDS_AT: ends_at,
        }
