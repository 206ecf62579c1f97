"""A worker's side of the run's refreshes: when it looks for newer negatives, when it waits for
them, and what each checkpoint it publishes asks of the refresh coordinator (docs/refresh.md).

(``training.cores: handover``, the trainer's cores handed to a running refresh, is another
thing: :mod:`hnce.pipeline.train.cores`.)

- Looking: every ``training.negatives_check_every`` steps, and at the first step of a (re)start,
  every rank switches to the newest published negatives version without waiting, and rank 0
  reads the refresh log (:class:`~hnce.cluster.compute.refresh.health.RefreshHealth`: too many
  failures in a row stop every rank at the same step).
- Waiting: where the mode says so (``refresh.mode: sync``: at every checkpoint,
  :mod:`~hnce.cluster.compute.refresh.modes`) until the negatives mined with that step's
  checkpoint are live (a ``refresh_wait`` event); before the first step, for the initial
  negatives when the driver prepares them beside the workers' start (an
  ``initial_negatives_wait`` event; :mod:`hnce.cluster.compute.refresh.initial`).
- Asking: the trigger (:mod:`~hnce.cluster.compute.refresh.triggers`) may ask for a refresh at a
  look (the worker then publishes a checkpoint for it) or at a checkpoint; the mode says whether
  a checkpoint ends the run's refreshes and when training should end.

Every decision that changes what the ranks do is rank 0's, broadcast, so that every rank makes
the same collective calls. A wait also ends when the driver asks the workers to stop (SIGTERM:
``stop_asked``, a collective too; docs/failures.md, "Preemption").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from hnce.cluster.compute.refresh.drawn import NegativeFreshness
from hnce.cluster.compute.refresh.health import RefreshHealth
from hnce.cluster.compute.refresh.initial import initial_negatives_error
from hnce.cluster.compute.refresh.modes import RefreshMode
from hnce.cluster.compute.refresh.modes.asynchronous import AsyncMode
from hnce.cluster.compute.refresh.modes.synchronous import SyncMode
from hnce.cluster.compute.refresh.policy import (
    Decision,
    EventSink,
    Ranks,
    Trigger,
    TriggerContext,
)
from hnce.cluster.compute.refresh.timing import RefreshTiming
from hnce.cluster.compute.refresh.triggers import TRIGGER_SPECS
from hnce.cluster.stores.checkpoints import REFRESH_REQUEST, REFRESHES_END, TRAINING_ENDS_AT
from hnce.events import RunEvent

logger = logging.getLogger(__name__)

#: how often a waiting worker looks for the negatives it waits for: a look reads one small
#: manifest (and, for the initial negatives, broadcasts one int), so a wait ends within a fifth
#: of a second of the publication at no measurable cost
WAIT_POLL_SECONDS = 0.2


class LiveVersion(Protocol):
    """A published negatives version as the worker holds it."""

    @property
    def checkpoint_step(self) -> int: ...


class VersionInUse(Protocol):
    """The negatives version a worker draws from (:class:`hnce.pipeline.train.negatives.CandidateSource`)."""

    @property
    def current(self) -> LiveVersion | None: ...

    @property
    def version(self) -> int: ...


class NegativesInUse(Protocol):
    """What the hand-over reads and moves of a worker's negatives
    (:class:`~hnce.pipeline.train.negatives.TrainingData`): the version in use, the switch to the
    newest one (a collective) and how old the vectors of the hard negatives drawn were."""

    @property
    def source(self) -> VersionInUse: ...

    @property
    def freshness(self) -> NegativeFreshness: ...

    def switch(self, step: int, log: Any) -> None: ...


@dataclass(frozen=True)
class Cadence:
    """The task's ``training`` steps that concern the refreshes: ``steps`` in all, a look for
    newer negatives every ``check_every`` (``negatives_check_every``), a checkpoint every
    ``checkpoint_every``."""

    steps: int
    check_every: int
    checkpoint_every: int


class RefreshHandover:
    """One worker's side of one task's refreshes (module docs). ``refresh``: the ``refresh``
    section, None when the task does not refresh; ``initial_negatives_since``: the start of the
    driver that prepares the initial negatives beside the workers' start-up, None when they are
    ready; ``slowdown_prior``: how much slower a step runs beside a refresh before one has been
    measured (the worker's threads without one over its threads beside one); ``stop_asked``:
    whether the driver asked every rank to stop (a collective), which ends a wait."""

    def __init__(
        self,
        refresh: Any,
        cadence: Cadence,
        run_dir: Path,
        ranks: Ranks,
        log: EventSink | None,
        negatives: NegativesInUse,
        initial_negatives_since: float | None = None,
        slowdown_prior: float = 1.0,
        stop_asked: Callable[[], bool] = lambda: False,
    ) -> None:
        self.cadence = cadence
        self.stop_asked = stop_asked
        self.ranks = ranks
        self.log = log
        self.negatives = negatives
        self.run_dir = Path(run_dir)
        self.initial_negatives_since = initial_negatives_since
        self.ended = False
        self.health: RefreshHealth | None = None
        self.mode: RefreshMode | None = None
        self.trigger: Trigger | None = None
        self.trigger_name = ""
        if refresh is None or not refresh.enabled:
            return
        self.health = RefreshHealth(self.run_dir, ranks)
        timing = RefreshTiming(self.run_dir, slowdown_prior)
        if refresh.mode == "sync":
            self.mode = SyncMode(cadence.steps, cadence.checkpoint_every)
        else:
            self.mode = AsyncMode(timing, cadence.steps)
        spec = TRIGGER_SPECS[refresh.trigger]
        options = getattr(refresh, spec.group) if spec.options is not None else None
        context = TriggerContext(
            options, self.run_dir, cadence.steps, timing, negatives.freshness.window()
        )
        self.trigger, self.trigger_name, self.timing = spec.build(context), spec.name, timing

    def _stops(self, step: int) -> bool:
        """Whether the refreshes failed too often: every rank stops at ``step``."""
        return self.health is not None and self.health.should_stop(step, self.log)

    def _waits_at(self, step: int) -> bool:
        return self.mode is not None and self.mode.waits_at(step)

    def poll(self, step: int, first: bool = False) -> bool:
        """Before ``step`` (``first``: the first of this start): every ``check_every`` steps, and
        at the first, switch to the newest negatives version and read the refresh log; where the
        mode waits, wait for the negatives of that step's checkpoint (:meth:`wait_for_refresh`).
        True when every rank stops here: the refreshes failed too often, or the driver asked
        during the wait."""
        waits = self._waits_at(step)
        if not waits and step % self.cadence.check_every != 0 and not first:
            return False
        self.negatives.switch(step, self.log)
        if waits:
            return self.wait_for_refresh(step)
        return self._stops(step)

    def wait_for_refresh(self, step: int) -> bool:
        """Hold training at ``step`` until the negatives mined with the checkpoint of ``step``
        are live (a ``refresh_wait`` event says how long it took); True when the refreshes failed
        too often meanwhile, or the driver asked every rank to stop (the checkpoint of ``step``
        is published)."""
        started = time.perf_counter()
        source = self.negatives.source
        while source.current is None or source.current.checkpoint_step < step:
            if self._stops(step) or self.stop_asked():
                return True
            time.sleep(WAIT_POLL_SECONDS)
            self.negatives.switch(step, self.log)
        if self.log is not None:
            self.log.write(RunEvent.REFRESH_WAIT, step=step, seconds=time.perf_counter() - started)
        return False

    def wait_for_initial_negatives(self, step: int) -> bool:
        """When the driver prepares the initial negatives beside the workers' start: hold the
        first step (``step``) until they are live (an ``initial_negatives_wait`` event says how
        long that took); True when the driver reports that they failed (every rank stands down
        without training, and the driver raises the error) or asks every rank to stop."""
        since = self.initial_negatives_since
        if since is None:
            return False
        started = time.perf_counter()
        source = self.negatives.source
        self.negatives.switch(step, self.log)
        while source.current is None:
            failed = self.ranks.rank == 0 and (
                initial_negatives_error(self.run_dir, since) is not None
            )
            if self.ranks.broadcast_int(int(failed)) or self.stop_asked():
                return True
            time.sleep(WAIT_POLL_SECONDS)
            self.negatives.switch(step, self.log)
        if self.log is not None:
            seconds = time.perf_counter() - started
            self.log.write(RunEvent.INITIAL_NEGATIVES_WAIT, step=step, seconds=seconds)
        return False

    def after_step(self, step: int, loss: float, seconds: float) -> bool:
        """Record the step that ends at ``step`` (its ``loss`` and ``seconds``); every
        ``check_every`` steps, True when the trigger asks for a refresh now (the worker then
        publishes a checkpoint that asks for it)."""
        if self.trigger is None:
            return False
        self.timing.observe(seconds)
        self.trigger.after_step(step, loss, self.negatives.source.version)
        if step % self.cadence.check_every != 0:
            return False
        return self._agree(step, self.trigger.look(step))

    def _agree(self, step: int, decision: Decision) -> bool:
        """Rank 0's ``decision`` on every rank; rank 0 logs it (a ``refresh_decision`` event
        and its line) and the trigger hears of a request every rank agreed to."""
        assert self.trigger is not None
        refresh = bool(self.ranks.broadcast_int(int(decision.refresh)))
        if refresh:
            self.trigger.asked(step)
        if self.log is not None and decision.fields is not None:
            self.log.write(RunEvent.REFRESH_DECISION, trigger=self.trigger_name, **decision.fields)
        if decision.line is not None:
            logger.info("%s", decision.line)
        return refresh

    def publishes_at(self, step: int) -> bool:
        """A checkpoint every ``checkpoint_every`` steps and at the end."""
        return step % self.cadence.checkpoint_every == 0 or step == self.cadence.steps

    def refreshes_end(self, step: int) -> tuple[bool, float | None]:
        """Whether the checkpoint of ``step`` ends the run's refreshes, the mode's word from rank
        0 broadcast, and when training is expected to end (seconds since the epoch; None when
        unknown): the coordinator abandons a refresh that would publish after it. The first
        checkpoint that ends them writes a ``refreshes_end`` event with the figures."""
        if self.mode is None:
            return False, None
        end = self.mode.refreshes_end(step)
        ends = bool(self.ranks.broadcast_int(int(end.ends)))
        if ends and not self.ended and self.log is not None:
            self.log.write(
                RunEvent.REFRESHES_END,
                step=step,
                refresh_seconds=end.refresh_seconds,
                seconds_left=end.seconds_left,
            )
            logger.info(
                "no refresh from step %d on: the fastest took %s s, training has %s s left",
                step,
                "?" if end.refresh_seconds is None else f"{end.refresh_seconds:.0f}",
                "?" if end.seconds_left is None else f"{end.seconds_left:.0f}",
            )
        self.ended |= ends
        if end.seconds_left is None:
            return ends, None
        return ends, time.time() + end.seconds_left

    def checkpoint_request(self, step: int, asked: bool = False) -> dict[str, Any]:
        """What the checkpoint of ``step`` tells the coordinator (its state's refresh entries):
        whether it asks for a refresh (``asked`` at this step's look, else the trigger's
        :meth:`~hnce.cluster.compute.refresh.policy.Trigger.at_checkpoint`, unless refreshes
        ended), whether refreshes end (:meth:`refreshes_end`, a collective) and when training
        should end. A task that does not refresh asks at every checkpoint, as ``hnce refresh``
        run beside it would refresh each."""
        ends, ends_at = self.refreshes_end(step)
        if ends:
            request = False
        elif asked or self.trigger is None:
            request = True
        else:
            request = self._agree(step, self.trigger.at_checkpoint(step))
        return {REFRESH_REQUEST: request, REFRESHES_END: ends, TRAINING_ENDS_AT: ends_at}

    def stopping_request(self) -> dict[str, Any]:
        """What the checkpoint published when the run stops on SIGTERM tells the coordinator:
        no refresh asked (the coordinator is stopping), refreshes ended as they were; no
        collective, and the trigger hears nothing, so the resumed run decides as an
        uninterrupted one would."""
        return {REFRESH_REQUEST: False, REFRESHES_END: self.ended}
