"""Where FAISS shards are searched: the one place that chooses between the CPU and the GPUs
(docs/engines.md).

FAISS GPU shards (fp16 flat) when faiss has GPU support and the process sees a GPU (sharded over
several with faiss's own multi-GPU cloner when it sees more than one), CPU otherwise; the choice
is logged, and asking for `gpu` without one raises instead of falling back
(:func:`resolve_faiss_device`). Shards are always built on the CPU
(`hnce.cluster.stores.faiss_index.build_shard_index`) and placed here (:meth:`FaissDevice.place`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal

import faiss

from hnce.errors import InputError

logger = logging.getLogger(__name__)

#: ``index.faiss_device``: where a recipe asks its shards to be searched
DeviceRequest = Literal["auto", "cpu", "gpu"]


@dataclass
class FaissDevice:
    """Where shard indexes are searched: `cpu`, or GPUs with fp16 flat storage (one GPU, or
    several with each index sharded across them by faiss)."""

    kind: Literal["cpu", "gpu"]
    gpu_ids: tuple[int, ...] = ()
    float16: bool = True
    resources: list[object] = field(default_factory=list)  # faiss.StandardGpuResources per GPU

    def place(self, index: faiss.Index) -> faiss.Index:
        """`index` ready to search on this device (the CPU index itself on `cpu`)."""
        if self.kind == "cpu":
            return index
        if isinstance(index, faiss.IndexHNSW):
            raise InputError("FAISS has no GPU HNSW; set index.faiss_device: cpu for hnsw shards")
        if len(self.gpu_ids) > 1:
            options = faiss.GpuMultipleClonerOptions()
            options.shard = True
            options.useFloat16 = self.float16
            return faiss.index_cpu_to_gpu_multiple_py(
                self.resources, index, options, list(self.gpu_ids)
            )
        gpu_id, resources = self.gpu_ids[0], self.resources[0]
        if isinstance(index, faiss.IndexFlat):
            config = faiss.GpuIndexFlatConfig()
            config.device = gpu_id
            config.useFloat16 = self.float16
            gpu_index = faiss.GpuIndexFlatIP(resources, index.d, config)
            gpu_index.copyFrom(index)
            return gpu_index
        options = faiss.GpuClonerOptions()
        options.useFloat16 = self.float16
        return faiss.index_cpu_to_gpu(resources, gpu_id, index, options)

    def describe(self) -> str:
        if self.kind == "cpu":
            return "CPU"
        return f"GPU {', '.join(map(str, self.gpu_ids))} (fp16 flat storage)"


def faiss_gpu_count() -> int:
    """GPUs FAISS can use: 0 with faiss-cpu (no `StandardGpuResources`) or no visible GPU."""
    if not hasattr(faiss, "StandardGpuResources"):
        return 0
    return int(faiss.get_num_gpus())


def resolve_faiss_device(requested: DeviceRequest = "auto") -> FaissDevice:
    """The device for shard search: the only place that chooses between CPU and GPU.

    `auto` takes every GPU this process sees (a Ray actor sees the GPUs Ray assigned it) when
    FAISS has GPU support, else the CPU; `gpu` without one raises `InputError` (never a silent
    fallback); `cpu` forces the CPU. The choice is logged.
    """
    if requested not in ("auto", "cpu", "gpu"):
        raise ValueError(f"faiss device must be auto, cpu or gpu, got {requested!r}")
    gpus = faiss_gpu_count()
    if requested == "gpu" and gpus == 0:
        reason = (
            "this faiss build has no GPU support (install the `gpu` extra, faiss-gpu-cu12)"
            if not hasattr(faiss, "StandardGpuResources")
            else "faiss sees no GPU"
        )
        raise InputError(f"index.faiss_device is gpu but {reason}")
    if requested == "cpu" or gpus == 0:
        logger.info("FAISS shards on CPU (%s)", "forced" if requested == "cpu" else "no GPU")
        return FaissDevice("cpu")
    device = FaissDevice(
        "gpu",
        gpu_ids=tuple(range(gpus)),
        resources=[faiss.StandardGpuResources() for _ in range(gpus)],
    )
    logger.info("FAISS shards on %s", device.describe())
    return device
