"""Shared by the losses: input checks and the gold-first softmax logits under the ``valid`` mask."""

from __future__ import annotations

import torch
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


def gold_first_logits(
    positive_scores: Tensor, negative_logits: Tensor, valid: Tensor | None, temperature: float
) -> Tensor:
    """[B, 1+K] softmax logits: s(x,y)/τ in column 0, then the negatives' logits (already scaled
    and corrected by the caller) with ``valid=False`` entries at −inf, i.e. out of the softmax."""
    if valid is not None:
        negative_logits = negative_logits.masked_fill(~valid, float("-inf"))
    return torch.cat([positive_scores.unsqueeze(1) / temperature, negative_logits], dim=1)
