"""The worker's device and its collectives, each tensor on the device its backend needs.

Ray Train assigns every worker its device (``ray.train.torch.get_device()``: the worker's own
CUDA device on a GPU cluster, the CPU otherwise) and starts the process group (NCCL with GPUs,
gloo without, ``hnce.pipeline.train.trainer``). NCCL only moves CUDA tensors and gloo only CPU ones:
a CPU tensor handed to an NCCL broadcast raises, so every collective of the worker goes through
:class:`Collectives`, which puts its tensors on the right device. The device is never guessed
from ``torch.cuda.is_available()`` or from which GPUs happen to be visible. Models a command
loads into its own process (the linker's, the reranker job's) follow the recipe's
``cluster.use_gpu`` (:func:`hnce.pipeline.devices.local_device`).
"""

from __future__ import annotations

import logging

import ray.train.torch
import torch
import torch.distributed as dist
from torch import Tensor
from torch.nn import functional

logger = logging.getLogger(__name__)


def _zero_padded(tensor: Tensor, shape: list[int]) -> Tensor:
    """``tensor`` padded with zeros (False) at the end of each dimension to ``shape``; the
    padding is differentiable, so gradients reach ``tensor``."""
    widths = [
        width
        for dim in reversed(range(tensor.dim()))
        for width in (0, shape[dim] - tensor.shape[dim])
    ]
    return functional.pad(tensor, widths)


def worker_device(use_gpu: bool) -> torch.device:
    """The device Ray Train assigned to this worker, made current; asking for GPUs
    (``cluster.use_gpu``) and getting none is an error, never a silent CPU run."""
    device = ray.train.torch.get_device()
    if use_gpu and device.type != "cuda":
        raise RuntimeError(
            f"cluster.use_gpu is true but Ray Train gave this worker {device}: no GPU is visible "
            f"to it (check the nodes' GPUs and CUDA_VISIBLE_DEVICES)"
        )
    if device.type == "cuda":
        torch.cuda.set_device(device)
        device = torch.device("cuda", torch.cuda.current_device())
    return device


class Collectives:
    """Broadcasts, gathers and barriers of one worker over the default process group (no-ops
    without one).

    Tensors are created on :attr:`device`: the worker's CUDA device under NCCL, the CPU under
    gloo. Every rank must make the same calls in the same order.
    """

    def __init__(self, device: torch.device) -> None:
        self.active = dist.is_available() and dist.is_initialized()
        self.backend = str(dist.get_backend()) if self.active else "none"
        self.rank = dist.get_rank() if self.active else 0
        self.world_size = dist.get_world_size() if self.active else 1
        if self.backend == "nccl" and device.type != "cuda":
            raise RuntimeError(f"the NCCL backend needs a CUDA device, but the worker has {device}")
        self.device = device if self.backend == "nccl" else torch.device("cpu")
        logger.info("collectives: backend %s on %s", self.backend, self.device)

    def broadcast_int(self, value: int, source: int = 0) -> int:
        """``value`` as rank ``source`` gave it, on every rank."""
        tensor = torch.tensor([value], dtype=torch.long, device=self.device)
        if self.active:
            dist.broadcast(tensor, src=source)
        return int(tensor.item())

    def all_gather_rows(self, tensor: Tensor) -> tuple[Tensor, int]:
        """Every rank's ``tensor`` concatenated by row in rank order, on ``tensor``'s device, and
        the row where this rank's begin (the cross-batch negatives of ``negatives.share: global``).

        Ranks may hold different numbers of rows and different sizes in the other dimensions
        (som keeps one vector per token): every part is zero-padded to the largest (False for a
        mask). This rank's rows are ``tensor`` itself, so gradients flow to them; the other
        ranks' rows are constants (RocketQA's trick: gather, then put the local tensor back).
        """
        if not self.active:
            return tensor, 0
        shapes = [
            torch.zeros(tensor.dim(), dtype=torch.long, device=self.device)
            for _ in range(dist.get_world_size())
        ]
        dist.all_gather(shapes, torch.tensor(tensor.shape, dtype=torch.long, device=self.device))
        sizes = [[int(value.item()) for value in size.unbind()] for size in shapes]
        largest = [max(dimension) for dimension in zip(*sizes, strict=True)]
        rows = [size[0] for size in sizes]
        local = _zero_padded(tensor, [tensor.shape[0], *largest[1:]])
        wire = torch.uint8 if tensor.dtype == torch.bool else tensor.dtype  # gloo has no bool
        sent = _zero_padded(local.detach().to(wire), largest).to(self.device)
        received = [torch.empty(largest, dtype=wire, device=self.device) for _ in shapes]
        dist.all_gather(received, sent)
        parts = [
            part.narrow(0, 0, count).to(tensor.device, tensor.dtype)
            for part, count in zip(received, rows, strict=True)
        ]
        parts[self.rank] = local
        return torch.cat(parts), sum(rows[: self.rank])

    def barrier(self) -> None:
        """Wait for every rank (NCCL: on this worker's device, so no device is guessed)."""
        if not self.active:
            return
        if self.device.type == "cuda":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()
