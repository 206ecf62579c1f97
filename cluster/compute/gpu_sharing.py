"""Who holds a cluster's GPUs while training on them: trainer workers and encoder actors each a
GPU of their own, or a GPU shared between the two (``cluster.gpu_sharing``).

On a GPU cluster the refresh's encoder actors run on GPUs of their own (the ``hnce_encoder``
slots of a launched cluster, or the GPUs the trainer's workers leave) and the workers on theirs.
On a machine with no GPU to spare (one GPU, or as many GPUs as trainer workers) an encoder
asking for a whole GPU could never be placed while the trainer holds them all: the refresh, and
the initial negatives mined from the model, would wait until their deadline and fail. ``shared`` gives each
trainer worker and each encoder actor half a GPU (Ray's fractional GPUs): the two processes see
the same device and CUDA time-slices it between them, so the refresh encodes while the trainer
trains, as ANCE's asynchronous refresh asks, at the cost of each running slower while both work.

``auto`` (the default) is ``shared`` exactly when encoders run beside the trainer and the
cluster has fewer GPUs than the trainer's workers plus one, else ``dedicated``; the driver logs
which and why (:func:`resolve_gpu_sharing`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from hnce.cluster.compute.actors import PlacementError

logger = logging.getLogger(__name__)

GpuSharing = Literal["auto", "dedicated", "shared"]

SHARED_GPU = 0.5
"""The share of one GPU a trainer worker and an encoder actor each ask for when they share."""


@dataclass(frozen=True)
class GpuPlan:
    """How a training run holds GPUs.

    Attributes:
        mode: ``dedicated`` or ``shared``.
        worker_gpus: GPUs each trainer worker asks for (0 on CPUs).
        encoder_gpus: GPUs each encoder actor asks for where the cluster has GPUs.
        workers: the trainer's workers.
        why: the reason, logged by the driver.
    """

    mode: Literal["dedicated", "shared"]
    worker_gpus: float
    encoder_gpus: float
    workers: int
    why: str

    @property
    def trainer_gpus(self) -> float:
        """GPUs the trainer's workers hold together (left to them by the encoders)."""
        return self.worker_gpus * self.workers


def gpu_plan(mode: Literal["dedicated", "shared"], trainer_workers: int, why: str) -> GpuPlan:
    """The plan of ``mode`` on GPUs: a whole GPU for each trainer worker and encoder actor
    (``dedicated``), or :data:`SHARED_GPU` of one each (``shared``, said in ``why``)."""
    if mode == "dedicated":
        return GpuPlan(mode, 1.0, 1.0, trainer_workers, why)
    share = f"; each trainer worker and each encoder actor takes {SHARED_GPU:g} of a GPU"
    return GpuPlan(mode, SHARED_GPU, SHARED_GPU, trainer_workers, why + share)


def resolve_gpu_sharing(
    requested: GpuSharing,
    use_gpu: bool,
    cluster_gpus: float,
    trainer_workers: int,
    encoders_beside: bool,
    encoder_slots: bool = False,
) -> GpuPlan:
    """The GPU plan of a run that trains ``trainer_workers`` workers (on GPUs when ``use_gpu``)
    on a cluster of ``cluster_gpus`` GPUs, with encoder actors beside it when ``encoders_beside``
    (a refresh, or the initial negatives mined from the model) and on the launcher's ``hnce_encoder`` slots
    when ``encoder_slots``. Raises PlacementError for ``dedicated`` with no GPU left to an
    encoder, which would otherwise wait for a GPU the trainer never gives back."""
    if not use_gpu:
        return GpuPlan("dedicated", 0.0, 1.0, trainer_workers, "the trainer trains on CPUs")

    def plan(mode: Literal["dedicated", "shared"], why: str) -> GpuPlan:
        return gpu_plan(mode, trainer_workers, why)

    spare = cluster_gpus - trainer_workers
    if requested == "shared":
        return plan("shared", "cluster.gpu_sharing")
    if not encoders_beside:
        return plan("dedicated", f"{requested}: no encoder runs beside the trainer")
    if encoder_slots:
        return plan("dedicated", f"{requested}: the encoders have the cluster's hnce_encoder slots")
    if spare >= 1:
        return plan(
            "dedicated",
            f"{requested}: {cluster_gpus:g} GPU(s), {trainer_workers} for the trainer's workers "
            f"and {spare:g} for the encoders",
        )
    if requested == "dedicated":
        raise PlacementError(
            f"cluster.gpu_sharing is dedicated, but the cluster's {cluster_gpus:g} GPU(s) all go "
            f"to the trainer's {trainer_workers} worker(s) and none is left for the refresh's "
            f"encoders; add a GPU, train on fewer workers, or set cluster.gpu_sharing: shared"
        )
    return plan(
        "shared",
        f"auto: {cluster_gpus:g} GPU(s) for {trainer_workers} trainer worker(s) and the encoders "
        "beside them",
    )


def encoders_on_gpus(cluster_gpus: float, trainer_gpus: float, encoder_gpus: float) -> int:
    """Encoder actors of ``encoder_gpus`` each that the GPUs a trainer leaves hold (at least 1:
    a pool on a cluster without GPUs has one CPU actor)."""
    return max(1, int((cluster_gpus - trainer_gpus) / encoder_gpus + 1e-9))
