"""Where a model loaded into a command's own process runs.

A trainer worker's device is Ray Train's to assign (``hnce.pipeline.train.distributed``); a model
a command loads into its own (driver) process, e.g. the linker's reranker and bi-encoder or the
reranker job's scoring, follows the recipe's ``cluster.use_gpu`` (:func:`local_device`).
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)


def local_device(use_gpu: bool) -> torch.device:
    """Where a model loaded into this (driver) process runs, e.g. the linker's reranker and
    bi-encoder or the reranker job's scoring: CUDA when the recipe asks for GPUs
    (``cluster.use_gpu``; none visible here is an error, never a silent CPU run), else the CPU;
    logged."""
    if use_gpu and not torch.cuda.is_available():
        raise RuntimeError(
            "cluster.use_gpu is true but torch sees no CUDA device in this process: run the "
            "command on a GPU node, or set cluster.use_gpu: false"
        )
    device = torch.device("cuda" if use_gpu else "cpu")
    logger.info("models loaded in this process run on %s (cluster.use_gpu %s)", device, use_gpu)
    return device
