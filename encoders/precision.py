"""Mixed precision for every encoder forward pass: bf16 autocast on CUDA, fp32 elsewhere.

Training (DeepSpeed bf16), the refresh's entity encoders, mention encoding for mining and
evaluation all run their towers inside :func:`autocast`, so a GPU never silently runs fp32 and a
CPU run keeps exact fp32 arithmetic (the tests' equalities rely on it).
"""

from __future__ import annotations

import contextlib

import torch


def bf16_supported(device: torch.device) -> bool:
    """True on a CUDA device with bf16 support (Ampere and later)."""
    return device.type == "cuda" and torch.cuda.is_bf16_supported()


def autocast(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """bf16 autocast on a bf16-capable CUDA device; a no-op context on the CPU."""
    if bf16_supported(device):
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()
