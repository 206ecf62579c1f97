"""Who runs on a machine's cores while training: the trainer, or the refresh beside it (``training.cores``).

On a cluster whose encoders have their own CPUs or GPUs, every trainer worker runs its
``training.cpus_per_worker`` threads and the refresh never touches them (``reserved``). On the one
machine where users try hnce, the trainer and the refresh's encoder actors share the cores, and a
fixed split leaves the refresh's cores idle whenever it has nothing to encode: between refreshes,
with ``refresh.trigger: stale`` most of the run, and in every run without a refresh. With
``handover`` each trainer worker runs on every core of its node (split among the node's workers)
while no refresh of the run is working, and drops back to ``cpus_per_worker`` threads for as long
as one is, so trainer and encoders never fight for a core.

"A refresh is working" is read, once per step, from the run lock's holder record
(``<run>/refresh.lock.json``, :func:`hnce.cluster.stores.lock_holder.encoding_checkpoint`): the
coordinator and ``hnce refresh`` record the checkpoint they refresh from choosing it to publishing
its negatives (encoding, held-out recall, mining), and the record is gone, or provably stale, when
they are not. Reading it costs a file read per step and needs no collective: each rank decides
for itself.

With ``refresh.mode: sync`` the trainer waits while each refresh works, so ``handover`` also
goes the other way: the trainer lends its threads to that refresh's encoder actors
(:func:`threads_lent_to_refresh`), and every core works on whichever of the two is running.
Sync runs refresh only the checkpoints training waits for (every ``training.checkpoint_every``
steps), so no refresh runs while the trainer trains.

``auto`` (the default) is ``handover`` when Ray is one node and the run trains on CPUs, else
``reserved``; the driver logs which and why (:func:`resolve_cores`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from hnce.cluster.stores.lock_holder import encoding_checkpoint
from hnce.pipeline.config import CoresMode

logger = logging.getLogger(__name__)


def resolve_cores(requested: CoresMode, nodes: int, use_gpu: bool) -> tuple[CoresMode, str]:
    """The mode a run uses for ``training.cores: requested`` on a Ray cluster of ``nodes`` alive
    nodes, and why (the driver logs both)."""
    if requested != "auto":
        return requested, "training.cores"
    if use_gpu:
        return "reserved", "auto: the trainer trains on GPUs"
    if nodes > 1:
        return "reserved", f"auto: {nodes} Ray nodes, the encoders may have their own"
    return "handover", "auto: one Ray node, trainer and refresh share its cores"


def describe_cores(
    mode: CoresMode, why: str, workers: int, cpus_per_worker: float, cores: int | None
) -> str:
    """What the driver logs of the run's threads, for ``workers`` trainer workers on a node of
    ``cores`` cores (None: not known here, several nodes or a remote one), so a recipe that
    names no machine says what it got."""
    reserved = reserved_threads(cpus_per_worker)
    if mode != "handover":
        return f"{workers} worker(s) x {reserved} thread(s) ({mode}: {why})"
    idle = f"{max(reserved, cores // workers)} thread(s)" if cores else "its node's share"
    return (
        f"{workers} worker(s), each on {idle} while no refresh works and {reserved} while one "
        f"does ({mode}: {why})"
    )


def reserved_threads(cpus_per_worker: float) -> int:
    """A worker's own torch threads: its ``cpus_per_worker``, at least 1."""
    return max(1, int(cpus_per_worker))


def threads_lent_to_refresh(
    mode: CoresMode, waits_for_refreshes: bool, num_workers: int, cpus_per_worker: float
) -> int:
    """Torch threads the trainer lends each refresh's encoders: its workers' reserved threads
    when it waits for the refreshes (``refresh.mode: sync``) and hands cores over; else 0."""
    if mode != "handover" or not waits_for_refreshes:
        return 0
    return num_workers * reserved_threads(cpus_per_worker)


@dataclass
class TrainerThreads:
    """One worker's torch threads, set before each step (module docs).

    Attributes:
        run_dir: the run whose refreshes the worker gives way to.
        reserved: threads while a refresh works (``cpus_per_worker``), and always in ``reserved``.
        idle: threads while none does.
    """

    run_dir: Path
    reserved: int
    idle: int
    current: int = 0

    @classmethod
    def for_worker(
        cls,
        run_dir: Path,
        mode: CoresMode,
        cpus_per_worker: float,
        node_cores: int,
        workers: int,
        waits_for_refreshes: bool = False,
    ) -> TrainerThreads:
        """A worker's threads: ``cpus_per_worker`` (at least 1) reserved; with ``handover`` its
        share of its node's ``node_cores`` among the ``workers`` there while no refresh works,
        and always when it ``waits_for_refreshes`` (sync: its refreshes run only while it
        waits, so a step never shares the cores and its threads never depend on timing)."""
        reserved = reserved_threads(cpus_per_worker)
        idle = max(reserved, node_cores // workers) if mode == "handover" else reserved
        return cls(Path(run_dir), idle if waits_for_refreshes else reserved, idle)

    def for_step(self) -> int:
        """Set and return the threads of the next step."""
        threads = self.idle
        if self.idle != self.reserved and encoding_checkpoint(self.run_dir) is not None:
            threads = self.reserved
        if threads != self.current:
            torch.set_num_threads(threads)
            logger.debug("trainer threads %d -> %d", self.current, threads)
            self.current = threads
        return threads
