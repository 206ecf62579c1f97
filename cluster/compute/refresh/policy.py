"""The one small interface behind every refresh trigger, and what the hand-over needs of a trainer.

A *trigger* says when a refresh is asked for (``refresh.trigger``: one module each under
:mod:`hnce.cluster.compute.refresh.triggers`); a *mode* says how the trainer meets the refreshes
(``refresh.mode``: :mod:`hnce.cluster.compute.refresh.modes`). The worker's hand-over
(:class:`~hnce.cluster.compute.refresh.handover.RefreshHandover`) drives both: after every step
it tells the trigger the step's loss, every ``training.negatives_check_every`` steps it asks
:meth:`Trigger.look` (a trigger may ask for a refresh right there: the worker then publishes a
checkpoint that asks for it), and at every checkpoint :meth:`Trigger.at_checkpoint`. Rank 0's
answer is broadcast, so every rank publishes the same request, and rank 0 logs it as a
``refresh_decision`` event (``trigger`` and the :class:`Decision`'s fields) and a log line.

A trigger module ends with ``SPEC = TriggerSpec(...)``: its name, how it is built, its typed
option group in the ``refresh`` section (``refresh.<name>.*``), a rule it sets on the recipe, the
TensorBoard scalars of its decision fields, and the one line ``hnce status`` prints of its
decisions. Adding a trigger is that module and its test, nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hnce.cluster.compute.refresh.drawn import DrawWindow
from hnce.cluster.compute.refresh.timing import RefreshTiming
from hnce.events import RunEvent


class EventSink(Protocol):
    """Where the refresh writes the run's events (the trainer's
    :class:`hnce.pipeline.event_log.EventLog`)."""

    def write(self, event: RunEvent, **fields: Any) -> None: ...


class Ranks(Protocol):
    """What the hand-over needs of a worker's process group
    (:class:`hnce.pipeline.train.distributed.Collectives`): its rank and rank 0's value of an int,
    on every rank (a collective)."""

    @property
    def rank(self) -> int: ...

    def broadcast_int(self, value: int) -> int: ...


@dataclass(frozen=True)
class Decision:
    """A trigger's answer at one step: whether it asks for a refresh, the fields of the
    ``refresh_decision`` event it is logged as (None: not logged) and its log line (None: none)."""

    refresh: bool
    fields: dict[str, Any] | None = None
    line: str | None = None


#: no refresh, nothing logged
NO_REFRESH = Decision(False)


class Trigger(Protocol):
    """When a refresh is asked for; one per worker, rank 0's answers count (module docs)."""

    def after_step(self, step: int, loss: float, version: int | None) -> None:
        """The step that ends at ``step`` had ``loss`` on negatives ``version``."""
        ...

    def look(self, step: int) -> Decision:
        """Every ``negatives_check_every`` steps: whether to ask for a refresh now (the worker
        publishes a checkpoint for it)."""
        ...

    def at_checkpoint(self, step: int) -> Decision:
        """Whether the checkpoint the worker publishes at ``step`` asks for a refresh."""
        ...

    def asked(self, step: int) -> None:
        """Every rank agreed to ask for a refresh at ``step``."""
        ...


@dataclass(frozen=True)
class TriggerContext:
    """What a trigger is built from: its option group (None when it has none), the run, its
    ``training.steps``, the refresh cost and step times (:class:`RefreshTiming`) and a window on
    the hard negatives the worker draws."""

    options: Any
    run_dir: Path
    steps: int
    timing: RefreshTiming
    drawn: DrawWindow


@dataclass(frozen=True)
class TriggerSpec:
    """One trigger as the recipe, its validation, the hand-over, TensorBoard and ``hnce status``
    see it.

    Attributes:
        name: the recipe's ``refresh.trigger`` value.
        build: ``(context) -> Trigger``.
        options: the settings class of its option group, ``refresh.<name>`` (:attr:`group`);
            None without one.
        asynchronous: it asks the coordinator beside a trainer that does not wait
            (``refresh.mode: async``); False when it also serves ``sync``.
        scalars: TensorBoard tag of each numeric field of its decisions.
        summary: ``(its refresh_decision events) -> the line of hnce status``.
    """

    name: str
    build: Callable[[TriggerContext], Trigger]
    options: type | None = None
    asynchronous: bool = True
    scalars: dict[str, str] = field(default_factory=dict)
    summary: Callable[[list[dict[str, Any]]], str] | None = None

    @property
    def group(self) -> str:
        """The option group's key in the ``refresh`` section (``-`` read as ``_``)."""
        return self.name.replace("-", "_")
