"""What an entity encoder computes, in whichever process runs it: the index vectors of a shard's
entities from their token rows (:func:`encode_entities`, similar lengths batched together), a
compressed sum-of-max shard encoded chunk by chunk onto its version's quantiser
(:func:`encode_compressed_tokens`), the sample a quantiser trains on (:func:`training_sample`),
the query vectors of a batch of mentions (:func:`encode_mention_queries`) and precomputed entity
encodings read memory-mapped (:func:`read_encodings`).

The encoder actors (``hnce.cluster.compute.encoder_actor``) run these on their loaded model; the
linker runs them in its own process on a small catalogue. Nothing here imports Ray.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np
import torch

from hnce.cluster.stores.index_spec import IndexSpec
from hnce.cluster.stores.plaid import plaid_codes
from hnce.cluster.stores.pq_codes import add_token_codes
from hnce.cluster.stores.tokens import TokenStore
from hnce.encoders.biencoder import BiEncoder
from hnce.encoders.formatting import length_sorted_batches
from hnce.encoders.precision import autocast
from hnce.encoders.token_pooling import pool_tokens
from hnce.errors import InputError

#: Entities encoded at once into a compressed token shard (bounds its full-precision vectors)
COMPRESSED_CHUNK_ENTITIES = 1024


class ShardCancelled(RuntimeError):
    """A shard task stopped between batches because Ray cancelled it (``ray.cancel``)."""


@torch.inference_mode()
def encode_entities(
    model: BiEncoder,
    tokens: TokenStore,
    entity_ids: np.ndarray,
    batch_size: int,
    bucketed: bool = True,
    cancelled: Callable[[], bool] = lambda: False,
    pool_factor: int = 1,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Index vectors of `entity_ids` from their token-store rows, in entity order.

    Returns (vectors float32 [V, d], the entity id of each vector int64 [V], padded token count).
    Sum-of-max token vectors are pooled by `pool_factor` (``index.token_pool_factor``,
    :mod:`hnce.encoders.token_pooling`). `bucketed` groups entities of similar length into a
    batch, each padded to its longest;
    otherwise batches follow catalogue order padded to the entity length (the fixed-padding
    baseline of the benchmarks). `cancelled` is asked before each batch; ShardCancelled when
    it says yes (an abandoned refresh stops within one batch, not one shard).
    """
    device = next(model.entity_tower.parameters()).device
    entity_ids = np.asarray(entity_ids, dtype=np.int64)
    lengths = np.asarray(tokens.lengths[entity_ids])
    if bucketed:
        batches = length_sorted_batches(lengths, batch_size)
    else:
        order = np.arange(len(entity_ids))
        batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    vectors, rows, padded = [], [], 0
    for batch in batches:
        if cancelled():
            raise ShardCancelled(f"cancelled after {sum(map(len, rows))} of {len(entity_ids)}")
        inputs = tokens.batch(entity_ids[batch])
        if not bucketed:
            inputs = {name: _pad_to(value, model.entity_length) for name, value in inputs.items()}
        padded += inputs["input_ids"].numel()
        with autocast(device):
            batch_vectors, batch_rows = model.entity_index_vectors(
                inputs["input_ids"].to(device), inputs["attention_mask"].to(device)
            )
        vectors.append(batch_vectors.float().cpu().numpy())
        rows.append(batch[batch_rows.cpu().numpy()])
    if not vectors:
        return np.zeros((0, model.output_size), np.float32), np.zeros(0, np.int64), 0
    all_rows = np.concatenate(rows).astype(np.int64)
    order = np.argsort(all_rows, kind="stable")  # back to catalogue order, tokens in order
    pooled, pooled_ids = pool_tokens(
        np.concatenate(vectors)[order], entity_ids[all_rows[order]], pool_factor
    )
    return pooled, pooled_ids, padded


@dataclass(frozen=True)
class BuiltShard:
    """A shard's CPU index, the entity id of each of its vectors, a compressed sum-of-max
    shard's standalone token codes (:func:`encode_compressed_tokens`; None otherwise), the
    padded tokens its encoding ran over, and a compressed multi-m shard's (or a compressed
    sum-of-max shard's with ``index.token_copy``) float16 copy of its vectors (None otherwise)."""

    index: faiss.Index
    ids: np.ndarray
    codes: np.ndarray | None = None
    padded_tokens: int = 0
    vectors: np.ndarray | None = None


def training_sample(lengths: np.ndarray, train_size: int, seed: int) -> np.ndarray:
    """Positions (sorted) of a seeded random sample of entities whose `lengths` (vectors: tokens
    for sum-of-max) add up to at least `train_size`, or all of them: what a version's IVF-PQ
    quantiser trains on."""
    shuffled = np.random.default_rng(seed).permutation(len(lengths))
    reach = np.cumsum(np.asarray(lengths)[shuffled])
    return np.sort(shuffled[: int(np.searchsorted(reach, train_size)) + 1])


def compress_tokens(
    trained: faiss.Index,
    chunks: Iterable[tuple[np.ndarray, np.ndarray, int]],
    spec: IndexSpec,
) -> BuiltShard:
    """A compressed sum-of-max shard: each chunk of (token vectors, their entity ids, padded
    tokens), in entity order, added to the IVF lists of a copy of the version's `trained`
    quantiser and encoded into standalone codes before the next chunk is asked for (ColBERTv2's
    indexing, Santhanam et al. 2022, §3.3); with `spec.token_copy`, kept as a float16 copy
    instead of codes (2·d bytes a token, held until the shard is written, as the codes are).
    A plaid shard keeps the codes, its IVF lists empty (:mod:`hnce.cluster.stores.plaid`), and
    with `spec.token_copy` the float16 copy beside them (its survivors are scored from it)."""
    index = faiss.clone_index(trained)
    coded, copies, ids, padded = [], [], [], 0
    for vectors, vector_ids, chunk_padded in chunks:
        if spec.kind == "plaid":
            coded.append(plaid_codes(index, vectors))
        elif spec.token_copy:
            index.add(vectors)
        else:
            coded.append(add_token_codes(index, vectors))
        if spec.token_copy:
            copies.append(vectors.astype(np.float16))
        ids.append(vector_ids)
        padded += chunk_padded
    codes = np.concatenate(coded) if coded else None
    copy = np.concatenate(copies) if copies else None
    return BuiltShard(index, np.concatenate(ids), codes, padded, copy)


def encode_compressed_tokens(
    model: BiEncoder,
    tokens: TokenStore,
    entity_ids: np.ndarray,
    trained: faiss.Index,
    spec: IndexSpec,
    batch_size: int,
    cancelled: Callable[[], bool] = lambda: False,
    chunk_entities: int = COMPRESSED_CHUNK_ENTITIES,
) -> BuiltShard:
    """Sum-of-max token vectors of `entity_ids` straight into a compressed shard on the
    version's `trained` quantiser (:func:`compress_tokens`), so that no more than one chunk of
    `chunk_entities` entities is ever held at full precision."""
    entity_ids = np.asarray(entity_ids, dtype=np.int64)
    chunks = (
        encode_entities(
            model,
            tokens,
            entity_ids[start : start + chunk_entities],
            batch_size,
            cancelled=cancelled,
            pool_factor=spec.token_pool_factor,
        )
        for start in range(0, len(entity_ids), chunk_entities)
    )
    return compress_tokens(trained, chunks, spec)


@torch.inference_mode()
def encode_mention_queries(
    model: BiEncoder,
    context_left: Sequence[str],
    mention: Sequence[str],
    context_right: Sequence[str],
) -> np.ndarray:
    """Query vectors float32 [B, Q, d] of a batch of mentions (Q = 1 for dual and multi-m)."""
    device = next(model.mention_tower.parameters()).device
    tokens = model.tokenize_mentions(context_left, mention, context_right)
    with autocast(device):
        queries = model.mention_query_vectors(
            tokens["input_ids"].to(device), tokens["attention_mask"].to(device)
        )
    return queries.float().cpu().numpy()


def _pad_to(tensor: torch.Tensor, width: int) -> torch.Tensor:
    if tensor.shape[1] >= width:
        return tensor[:, :width]
    return torch.nn.functional.pad(tensor, (0, width - tensor.shape[1]))


def read_encodings(path: Path) -> torch.Tensor:
    """Precomputed entity vectors [N, d] (BLINK's ``all_entities_large.t7``: row i is entity i),
    memory-mapped (``torch.load(mmap=True, weights_only=True)``): nothing is read into memory
    until a shard's rows are taken."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such encodings file")
    try:
        encodings = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except (RuntimeError, pickle.UnpicklingError, EOFError) as error:
        raise InputError(
            f"{path}: cannot memory-map as a torch tensor file (torch.save zip format needed; "
            f"re-save a legacy file once with torch.save(torch.load(path), path)): {error}"
        ) from error
    if not isinstance(encodings, torch.Tensor) or encodings.dim() != 2:
        kind = tuple(encodings.shape) if isinstance(encodings, torch.Tensor) else type(encodings)
        raise InputError(f"{path}: expected a 2-d tensor [entities, dim], got {kind}")
    if encodings.dtype != torch.float32:
        raise InputError(f"{path}: expected float32 encodings, got {encodings.dtype}")
    return encodings
