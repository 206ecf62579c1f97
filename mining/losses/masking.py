"""Shared checks for the losses: shapes and the ``valid`` mask of the samplers."""

from __future__ import annotations

from torch import Tensor


def check_inputs(
    positive_scores: Tensor, negative_scores: Tensor, valid: Tensor | None, log_q: Tensor | None
) -> None:
    """Raise ValueError (naming this file) unless positives are [B] and the rest [B, K]."""
    if positive_scores.dim() != 1 or negative_scores.dim() != 2:
        raise ValueError(
            f"{__file__}: positive_scores must be [B] and negative_scores [B, K], got "
            f"{tuple(positive_scores.shape)} and {tuple(negative_scores.shape)}"
        )
    if negative_scores.shape[0] != positive_scores.shape[0]:
        raise ValueError(
            f"{__file__}: batch sizes differ: {positive_scores.shape[0]} positives, "
            f"{negative_scores.shape[0]} negative rows"
        )
    for name, tensor in (("valid", valid), ("log_q", log_q)):
        if tensor is not None and tensor.shape != negative_scores.shape:
            raise ValueError(
                f"{__file__}: {name} must have the shape of negative_scores "
                f"{tuple(negative_scores.shape)}, got {tuple(tensor.shape)}"
            )
