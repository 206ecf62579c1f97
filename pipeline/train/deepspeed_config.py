"""The DeepSpeed configuration of a run, derived from `TrainingSettings` and the worker's device.

Adam with warm-up then linear decay (DeepSpeed's ``WarmupDecayLR``), gradient clipping,
gradient accumulation and a configurable ZeRO stage. bf16 (DeepSpeed's bf16 mode) is used on a
CUDA device that supports it; on CPU the run is fp32. The optimizer is torch's fused Adam on every
device (DeepSpeed's ``torch_adam`` with torch's ``fused=True``), never DeepSpeed's FusedAdam: that
op is compiled just in time by nvcc on each GPU worker, and on an H200 node DeepSpeed 0.19's
builder failed to parse the ``9.0a`` architecture (docs/engines.md).
"""

from __future__ import annotations

from typing import Any

import torch

from hnce.encoders.precision import bf16_supported
from hnce.pipeline.config import TrainingSettings


def use_bf16(settings: TrainingSettings, device: torch.device) -> bool:
    """bf16 for ``precision: auto`` only on a CUDA device that supports it; ``bf16`` forces it."""
    if settings.precision == "fp32":
        return False
    supported = bf16_supported(device)
    if settings.precision == "bf16" and not supported:
        raise ValueError(
            f"'training.precision: bf16' but the worker's device {device} has no bf16 support; "
            "use precision=auto or fp32"
        )
    return supported


def build_deepspeed_config(settings: TrainingSettings, device: torch.device) -> dict[str, Any]:
    """The dict passed to ``deepspeed.initialize(config=...)``.

    ``settings.steps`` counts optimizer steps; each takes ``gradient_accumulation`` micro-steps
    of ``batch_size`` mentions per worker.
    """
    # DeepSpeed's schedule needs at least one warm-up step; "no warm-up" is one step that
    # already starts at the full learning rate.
    warmup = min(settings.warmup_steps, max(settings.steps - 1, 0))
    start_lr = settings.learning_rate if warmup == 0 else 0.0
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": settings.batch_size,
        "gradient_accumulation_steps": settings.gradient_accumulation,
        "gradient_clipping": settings.max_grad_norm,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        "optimizer": {
            # plain Adam, no weight decay: the paper's optimiser (§6.3), and the one every
            # measured recipe here trained with
            "type": "Adam",
            "params": {
                "lr": settings.learning_rate,
                "weight_decay": 0.0,
                # torch's Adam: no op compiled on the workers. Fused: one kernel over every
                # tensor, on CPUs as on GPUs; without it a CPU runs Adam tensor by tensor, which
                # took 0.3 s of a 1.6 s step on the demo's two MiniLM towers (BENCHMARKS
                # "hnce's training step against the peer's").
                "torch_adam": True,
                "fused": True,
            },
        },
        "scheduler": {
            "type": "WarmupDecayLR",
            "params": {
                "total_num_steps": max(settings.steps, 1),
                "warmup_min_lr": start_lr,
                "warmup_max_lr": settings.learning_rate,
                "warmup_num_steps": max(warmup, 1),
                "warmup_type": "linear",
            },
        },
        "zero_optimization": {"stage": settings.zero_stage},
    }
    if use_bf16(settings, device):
        config["bf16"] = {"enabled": True}
    return config
