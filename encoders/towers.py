"""How a transformer tower runs: its attention kernel, activation checkpointing, chunked encoding.

Three memory and speed choices every tower of hnce shares (the bi-encoder's mention and entity
towers, the joint reranker's encoder), made explicitly and logged:

- **attention**: PyTorch's fused ``scaled_dot_product_attention`` (SDPA: flash / memory-efficient
  kernels on a GPU, no [heads, L, L] probabilities kept for the backward) wherever the model class
  supports it, eager attention otherwise (:func:`use_sdpa`);
- **activation checkpointing**: Hugging Face gradient checkpointing keeps only each layer's input
  and recomputes the layer in the backward pass (:func:`enable_activation_checkpointing`);
- **chunked encoding**: a micro-batch's candidates are encoded in chunks whose activations are
  recomputed in the backward pass (``torch.utils.checkpoint`` per chunk), so activation memory is
  bounded by one chunk and the number of negatives is not (:func:`checkpointed_chunks`).

Example::

    use_sdpa(tower, "entity")
    vectors, mask = checkpointed_chunks(encode, [input_ids, attention_mask], chunk_size=64)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel

logger = logging.getLogger(__name__)


def use_sdpa(tower: PreTrainedModel, name: str) -> str:
    """Set ``tower`` to SDPA attention when its class supports it, else eager; returns the choice.

    The choice is logged once per tower, so a run's log says which kernel trained and encoded.
    """
    choice = "sdpa" if getattr(tower, "_supports_sdpa", False) else "eager"
    if tower.config._attn_implementation != choice:
        tower.set_attn_implementation(choice)
    logger.info("%s tower (%s): %s attention", name, type(tower).__name__, choice)
    return choice


def enable_activation_checkpointing(tower: PreTrainedModel, name: str) -> None:
    """Recompute each layer of ``tower`` in the backward pass instead of keeping its activations
    (Hugging Face gradient checkpointing, non-reentrant); active in training mode only."""
    if not tower.supports_gradient_checkpointing:
        raise ValueError(
            f"{name} tower ({type(tower).__name__}) does not support activation checkpointing; "
            f"set model.activation_checkpointing: false"
        )
    tower.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    logger.info("%s tower: activation checkpointing on", name)


def checkpointed_chunks(
    function: Callable[..., Tensor | tuple[Tensor, ...]],
    tensors: Sequence[Tensor],
    chunk_size: int,
) -> tuple[Tensor, ...]:
    """``function`` over row chunks of ``tensors`` (each [N, ...]), outputs concatenated by row.

    With ``chunk_size`` 0 (or at least N) ``function`` runs once on everything. Otherwise it runs
    on ``chunk_size`` rows at a time and, while autograd records, each chunk runs under
    ``torch.utils.checkpoint``: the chunk's activations are freed after its forward and recomputed
    (with the same dropout) in the backward, so peak activation memory is one chunk's while every
    output row keeps its gradient. Values and gradients equal the unchunked call's up to
    floating-point summation order. Outputs are returned as a tuple.
    """
    rows = tensors[0].shape[0]
    if chunk_size <= 0 or chunk_size >= rows:
        return _as_tuple(function(*tensors))
    parts = []
    for start in range(0, rows, chunk_size):
        chunk = [tensor[start : start + chunk_size] for tensor in tensors]
        if torch.is_grad_enabled():
            parts.append(_as_tuple(checkpoint(function, *chunk, use_reentrant=False)))
        else:
            parts.append(_as_tuple(function(*chunk)))
    return tuple(torch.cat(outputs) for outputs in zip(*parts, strict=True))


def _as_tuple(output: Tensor | tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    return output if isinstance(output, tuple) else (output,)
