"""Starting Ray actors that can run, and waiting on their work without hanging (docs/refresh.md, docs/failures.md).

Two rules for every pool of actors hnce starts (the encoder actors, which also hold index shards):

- Before any work, the pool's request is checked against what the cluster's nodes offer in
  total (:func:`check_placeable`): asking for more actors than the cluster can ever place is a
  :class:`PlacementError` naming the resources asked and available, in seconds, instead of
  actors that stay pending forever. Actors that could be placed but do not start in time (the
  resources are held by others) are reported the same way (:meth:`TaskClock.wait_started`).
- Every wait has a deadline (:class:`TaskClock`): a floor until a task has been measured (it
  covers the model's load and the first task), then a generous multiple of the slowest task
  measured, never less than :data:`MEASURED_FLOOR_SECONDS` (an actor's restart). A wait that
  passes it is a :class:`TaskTimeout` naming the task and the actor.

Example::

    check_placeable({"CPU": 1.0}, 3, "encoder")
    clock = TaskClock(floor_seconds=900, what="entity shards")
    done = clock.wait_next(pending)            # pending: {ObjectRef: Task}
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import GetTimeoutError

from hnce.errors import InputError

TIMEOUT_MULTIPLE = 10.0
"""A task may take this many times the slowest one measured before it counts as hung."""
MEASURED_FLOOR_SECONDS = 300.0
"""The least patience once a task has been measured: the floor proper covers what comes before
the first (a model's load, a first shard at the slowest pace); after it, a hung actor is reported
within 10x the slowest task, and never sooner than this, which covers an actor Ray restarts
(a new process, its imports and the model's load) on a loaded node."""


class PlacementError(InputError):
    """More actors (or bigger ones) than the cluster can place."""


class TaskTimeout(RuntimeError):
    """An actor's task ran past its deadline."""


class StopRequested(RuntimeError):
    """A wait on actors' tasks gave up because its caller asked to stop (a refresh abandoned)."""


#: How often a wait that can be stopped looks at its ``stopping`` callable.
STOP_POLL_SECONDS = 0.5


def actor_request(
    num_cpus: float, num_gpus: float = 0.0, resources: Mapping[str, float] | None = None
) -> dict[str, float]:
    """One actor's request in Ray's resource names (``CPU``, ``GPU``, custom ones)."""
    request = {"CPU": float(num_cpus), "GPU": float(num_gpus), **(resources or {})}
    return {name: amount for name, amount in request.items() if amount > 0}


def placeable_count(request: Mapping[str, float], nodes: Sequence[Mapping[str, float]]) -> int:
    """How many actors of `request` the `nodes` (each a total-resources mapping) hold at once."""
    count = 0
    for node in nodes:
        fits = [math.floor(node.get(name, 0.0) / amount + 1e-9) for name, amount in request.items()]
        count += min(fits) if fits else 0
    return count


def check_placeable(request: Mapping[str, float], count: int, what: str) -> None:
    """Raise PlacementError unless the cluster's live nodes can hold `count` actors of `request`
    at once (counting every node's total resources, i.e. what it could ever offer)."""
    nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    fits = placeable_count(request, nodes)
    if fits < count:
        totals = ray.cluster_resources()
        offered = ", ".join(f"{name} {totals.get(name, 0.0):g}" for name in sorted(request))
        raise PlacementError(
            f"{count} {what} actor(s) asking {_describe(request)} each cannot be placed: the "
            f"cluster's {len(nodes)} node(s) offer {offered} in total, room for {fits} such "
            f"actor(s); lower refresh.num_encoders or refresh.encoder_cpus, or add nodes"
        )


def _describe(request: Mapping[str, float]) -> str:
    return "{" + ", ".join(f"{name}: {amount:g}" for name, amount in sorted(request.items())) + "}"


@dataclass(frozen=True)
class Task:
    """What a pending object reference stands for (named in a timeout)."""

    label: str
    actor: str
    submitted: float = field(default_factory=time.monotonic)


class TaskClock:
    """Deadlines for waits on actors' tasks, derived from the tasks measured so far.

    Args:
        floor_seconds: all the patience before a task has been measured
            (:data:`hnce.cluster.compute.encoder_pool.WAIT_FLOOR_SECONDS` for encoder actors).
        what: the kind of task, for messages ("entity shards").
        measured_floor_seconds: the least patience once one has (:data:`MEASURED_FLOOR_SECONDS`).
    """

    def __init__(
        self,
        floor_seconds: float,
        what: str,
        measured_floor_seconds: float | None = None,
    ) -> None:
        if measured_floor_seconds is None:
            measured_floor_seconds = MEASURED_FLOOR_SECONDS
        if floor_seconds <= 0 or measured_floor_seconds <= 0:
            raise ValueError(
                f"floors must be positive, got {floor_seconds} and {measured_floor_seconds}"
            )
        self.floor_seconds = floor_seconds
        self.measured_floor_seconds = measured_floor_seconds
        self.what = what
        self.slowest: float | None = None

    @property
    def timeout(self) -> float:
        """Seconds a wait may block: the floor until a task is measured, then
        max(measured floor, TIMEOUT_MULTIPLE × slowest task measured)."""
        if self.slowest is None:
            return self.floor_seconds
        return max(self.measured_floor_seconds, TIMEOUT_MULTIPLE * self.slowest)

    def record(self, seconds: float) -> None:
        """Measure one finished task."""
        self.slowest = seconds if self.slowest is None else max(self.slowest, seconds)

    def wait_next(
        self, pending: Mapping[ray.ObjectRef, Task], stopping: Callable[[], bool] | None = None
    ) -> ray.ObjectRef:
        """The first of `pending` to finish; TaskTimeout naming the longest-pending task when
        none finishes within :attr:`timeout`; StopRequested as soon as `stopping()` is true
        (looked at every :data:`STOP_POLL_SECONDS`)."""
        timeout = self.timeout
        deadline = time.monotonic() + timeout
        ready: list[ray.ObjectRef] = []
        while not ready and time.monotonic() < deadline:
            if stopping is not None and stopping():
                raise StopRequested(f"stopped while waiting for {len(pending)} {self.what}(s)")
            left = deadline - time.monotonic()
            wait = left if stopping is None else min(left, STOP_POLL_SECONDS)
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(wait, 0.0))
        if not ready:
            oldest = min(pending.values(), key=lambda task: task.submitted)
            raise TaskTimeout(
                f"{oldest.label} on actor {oldest.actor}: no {self.what} finished within "
                f"{timeout:.0f}s ({self._basis()}); the actor is hung or far slower than before"
            )
        return ready[0]

    def get(self, reference: ray.ObjectRef | list[ray.ObjectRef], task: Task) -> Any:
        """`ray.get` within :attr:`timeout`, measuring the task; TaskTimeout naming it."""
        timeout = self.timeout
        try:
            value = ray.get(reference, timeout=timeout)
        except GetTimeoutError:
            raise TaskTimeout(
                f"{task.label} on actor {task.actor}: not done within {timeout:.0f}s "
                f"({self._basis()})"
            ) from None
        self.record(time.monotonic() - task.submitted)
        return value

    def wait_started(
        self, ready: Sequence[ray.ObjectRef], names: Sequence[str], request: Mapping[str, float]
    ) -> list[Any]:
        """Wait for actors' `ready` calls; PlacementError naming those not started within the
        floor (their resources are held by others), with what the cluster has available."""
        done, _ = ray.wait(list(ready), num_returns=len(ready), timeout=self.floor_seconds)
        if len(done) < len(ready):
            waiting = [name for ref, name in zip(ready, names, strict=True) if ref not in done]
            available = ray.available_resources()
            free = ", ".join(f"{name} {available.get(name, 0.0):g}" for name in sorted(request))
            raise PlacementError(
                f"actor(s) {', '.join(waiting)} asking {_describe(request)} each did not start "
                f"within {self.floor_seconds:.0f}s; the cluster has {free} available now "
                f"(held by other work, e.g. trainer workers)"
            )
        return ray.get(list(ready))

    def _basis(self) -> str:
        if self.slowest is None:
            return f"the floor of {self.floor_seconds:g}s, none measured yet"
        return (
            f"{TIMEOUT_MULTIPLE:g}x the slowest so far, {self.slowest:.1f}s, at least "
            f"{self.measured_floor_seconds:g}s"
        )
