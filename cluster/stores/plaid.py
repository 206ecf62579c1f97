"""PLAID's token index, from the placement of a token to the exact scores of the survivors
(Santhanam et al. 2022, *PLAID: An Efficient Engine for Late Interaction Retrieval*, §4;
docs/indexes.md, "The plaid token index").

**Placement and codes.** A plaid shard stores each entity token as its centroid id and the
product code of its residual (ColBERTv2's compression, §3.3 there), in entity order: FAISS's
standalone IVF-PQ code (``sa_encode``), whose first bytes are the centroid id (:func:`plaid_codes`).
The centroids (2^16 and more at scale) are one FAISS IVF-PQ quantiser per index version, shared by
its shards and read once a process (:func:`read_plaid_index`); a token is placed through an HNSW
graph of them (:func:`plaid_quantizer`: a few µs a token where a flat quantiser's cost grows with
the centroids). Its IVF lists stay empty: no code is ever scanned to find candidates. In memory a
shard adds :class:`CentroidPostings`, its inverse: the entities that hold a token of each
centroid (PLAID's ``ivf.pid``), built from the codes when the shard is loaded.

**Search.** Sum-of-max s(x, y) = Σ_i max_j ⟨x_i, y_j⟩ (eq. 9 of Zhang & Stratos 2021) is
searched in PLAID's four stages, each narrower than the last, over the shards one holder holds
(:func:`plaid_search`):

1. **Candidate generation**: S = Q·Cᵀ scores each query token against every centroid; each
   query token probes its `nprobe` best centroids, and the entities holding a token of any
   probed centroid are the candidates (:func:`probe`).
2. **Centroid interaction with pruning**: s̃₂(y) = Σ_i max(max_{c ∈ C(y) ∩ P} S[i, c], m_i),
   where C(y) are y's centroids, P the probed ones (PLAID's pruning keeps only centroids near
   the query: here those some query token probed, a rank rather than PLAID's score threshold
   t_cs, since hnce's vectors need not be unit length) and m_i query token i's lowest probed
   centroid score, the most a centroid it did not probe can score (XTR's imputation, Lee et al.
   2023, as WARP uses it). Computed from the postings of P alone: no entity's tokens are read
   (:func:`pruned_interaction`). The best `candidate_depth` entities survive (PLAID's ndocs).
3. **Centroid interaction**: s̃₃(y) = Σ_i max_j S[i, c(y_j)] over every token's centroid id (no
   residual is decoded, :func:`centroid_interaction`); the best quarter survive (PLAID's
   ndocs/4).
4. **Exact scoring**: the survivors' residuals are decoded (centroid + residual), or read from
   the float16 token copy (``index.token_copy``), and s(x, y) is computed on them
   (:meth:`hnce.cluster.stores.index_shard.IndexShard.sum_of_max_top_k`).

Multi-m (s = max_t ⟨x, y_t⟩) is the same search with one query vector, its m vectors an entity
stored as tokens. With every centroid probed and every entity surviving, the result is exact
sum-of-max over the decoded tokens (``tests/test_cluster_plaid.py`` holds it to that).

The kernels are numpy on the CPU, vectorised over one mention's pairs of (entity, centroid).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import faiss
import numpy as np

from hnce.cluster.stores.index_spec import HNSW_M
from hnce.cluster.stores.pq_codes import assigned_codes
from hnce.errors import InputError
from hnce.search import merge_entity_lists

if TYPE_CHECKING:  # a type only: a shard knows its plaid inverse (IndexShard.postings)
    from hnce.cluster.stores.index_shard import IndexShard

#: plaid indexes read in this process, by SHA-256: a version's shards each carry the same
#: trained, empty quantiser (its centroids and HNSW graph), held once however many are loaded
_READ: dict[str, faiss.Index] = {}
#: plaid quantisers kept (a holder holds one version, and the next while it swaps)
_KEPT = 2


def plaid_quantizer(dim: int) -> faiss.Index:
    """The coarse quantiser of a plaid index: an HNSW graph of its centroids, through which a
    token is placed in a few µs at 2^16 of them, where a flat quantiser's cost grows with their
    number (module docstring)."""
    return faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)


def is_plaid(index: faiss.Index) -> bool:
    """Whether `index` is a plaid token index: an IVF-PQ whose quantiser is an HNSW graph and
    whose lists stay empty (its tokens live in their standalone codes, :func:`plaid_codes`)."""
    return isinstance(index, faiss.IndexIVFPQ) and isinstance(
        faiss.downcast_index(index.quantizer), faiss.IndexHNSW
    )


def plaid_codes(index: faiss.Index, vectors: np.ndarray) -> np.ndarray:
    """The standalone codes of `vectors` on a plaid `index` (each its centroid id, then the
    product code of its residual: PLAID's compression, Santhanam et al. 2022, §3.3 of
    ColBERTv2), placed through the index's HNSW quantiser; nothing is added to its lists."""
    if not is_plaid(index):
        raise InputError("plaid codes need a plaid index (index.kind: plaid)")
    return assigned_codes(index, vectors)[2]


def centroid_ids(codes: np.ndarray, index: faiss.IndexIVF) -> np.ndarray:
    """The centroid of each token (int64 [n]) from its standalone codes (uint8 [n, code size]):
    FAISS writes the list number first, little-endian, in ``coarse_code_size()`` bytes."""
    width = index.coarse_code_size()
    places = np.array([1 << (8 * byte) for byte in range(width)], dtype=np.int64)
    return np.asarray(codes[:, :width], dtype=np.int64) @ places


def read_plaid_index(path: Path, sha256: str) -> faiss.Index:
    """The plaid index file `path` (SHA-256 `sha256`, already verified or trusted), read once
    per process for every shard that carries the same bytes, its (empty) lists memory-mapped."""
    index = _READ.pop(sha256, None)
    if index is None:
        index = faiss.read_index(str(path), faiss.IO_FLAG_MMAP)
    _READ[sha256] = index  # the newest last: the oldest is dropped first
    while len(_READ) > _KEPT:
        del _READ[next(iter(_READ))]
    return index


@dataclass(frozen=True)
class CentroidPostings:
    """One plaid shard's inverse: for centroid c, ``entities[offsets[c]:offsets[c + 1]]`` are
    the shard's entity slots (positions in its sorted entity ids) with a token of c, each once;
    ``token_centroids`` is every token's centroid (int32, in shard order)."""

    offsets: np.ndarray
    entities: np.ndarray
    token_centroids: np.ndarray

    @classmethod
    def build(cls, token_centroids: np.ndarray, first: np.ndarray, centroids: int):
        """From each token's centroid and ``first`` (each entity slot's first token row, then
        the token count): the (centroid, entity) pairs sorted and made unique."""
        lengths = np.diff(first)
        slots = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
        pairs = np.unique(token_centroids.astype(np.int64) * len(lengths) + slots)
        by_centroid = pairs // max(len(lengths), 1)
        offsets = np.searchsorted(by_centroid, np.arange(centroids + 1))
        entities = (pairs - by_centroid * len(lengths)).astype(np.int32)
        return cls(offsets, entities, token_centroids.astype(np.int32))

    @property
    def nbytes(self) -> int:
        return self.offsets.nbytes + self.entities.nbytes + self.token_centroids.nbytes


def probe(centroid_scores: np.ndarray, nprobe: int) -> tuple[np.ndarray, np.ndarray]:
    """Stage 1: (the centroids any query token probes, sorted; each query token's lowest probed
    score m_i) from S [Q, K] (module docstring)."""
    nprobe = min(nprobe, centroid_scores.shape[1])
    probed = np.argpartition(-centroid_scores, nprobe - 1, axis=1)[:, :nprobe]
    floor = np.take_along_axis(centroid_scores, probed, axis=1).min(axis=1)
    return np.unique(probed), floor


def pruned_interaction(
    postings: CentroidPostings,
    scores_by_centroid: np.ndarray,
    probed: np.ndarray,
    floor: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Stage 2 over one shard: (entity slots holding a probed centroid, sorted; their s̃₂) from
    Sᵀ [K, Q] (module docstring)."""
    starts, stops = postings.offsets[probed], postings.offsets[probed + 1]
    lengths = stops - starts
    if not lengths.sum():
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    rows = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) + np.arange(lengths.sum())
    slots = postings.entities[rows]
    order = np.argsort(slots, kind="stable")
    slots = slots[order]
    centroids = np.repeat(probed, lengths)[order]
    unique, first = np.unique(slots, return_index=True)
    best = np.maximum.reduceat(scores_by_centroid[centroids], first, axis=0)  # [entities, Q]
    return unique.astype(np.int64), np.maximum(best, floor).sum(axis=1)


def centroid_interaction(
    postings: CentroidPostings, scores_by_centroid: np.ndarray, rows: np.ndarray, starts
) -> np.ndarray:
    """Stage 3: s̃₃ of entities whose token ``rows`` are runs beginning at ``starts`` (one run an
    entity, in order), from their tokens' centroid ids alone."""
    per_token = scores_by_centroid[postings.token_centroids[rows]]  # [tokens, Q]
    return np.maximum.reduceat(per_token, starts, axis=0).sum(axis=1)


def top(scores: np.ndarray, count: int) -> np.ndarray:
    """Positions of the `count` largest `scores`, in no order (all of them when fewer)."""
    if len(scores) <= count:
        return np.arange(len(scores))
    return np.argpartition(-scores, count - 1)[:count]


def survivors(found: Sequence[tuple[np.ndarray, np.ndarray]], count: int) -> list[np.ndarray]:
    """Each shard's (entity slots, scores) cut to the slots among the `count` best scores across
    all the shards, sorted per shard."""
    sizes = [len(slots) for slots, _ in found]
    kept = top(np.concatenate([scores for _, scores in found]), count)
    bounds = np.cumsum([0, *sizes])
    return [
        np.sort(slots[kept[(kept >= start) & (kept < stop)] - start])
        for (slots, _), start, stop in zip(found, bounds[:-1], bounds[1:], strict=True)
    ]


def plaid_search(
    shards: Sequence[IndexShard],
    queries: np.ndarray,
    k: int,
    candidate_depth: int,
    allowed: np.ndarray | None,
    stage_seconds: Counter[str],
) -> tuple[np.ndarray, np.ndarray]:
    """Top-k entities (ids, scores [B, k]) of each mention's query tokens `queries` [B, Q, d]
    (zero rows: padding) over plaid `shards` sharing one quantiser, in PLAID's four stages
    (module docstring): candidates from the query tokens' `nprobe` nearest centroids, pruned
    centroid interaction keeping `candidate_depth` entities (at least 4k), centroid interaction
    keeping a quarter of them, then exact sum-of-max on their decoded residuals, merged across
    shards. `allowed` (entity ids) restricts the candidates to those entities (a Zeshel world);
    the seconds of each stage are added to `stage_seconds` (generation: candidates and their
    pruned centroid interaction; interaction; exact: decoding and exact scoring)."""
    centroids = shards[0].centroids
    nprobe = faiss.extract_index_ivf(shards[0].index).nprobe
    kept_by_interaction = max(4 * k, candidate_depth)  # PLAID: ndocs, at least 4k
    decoded = kept_by_interaction // 4
    live = np.abs(queries).sum(axis=2) > 0
    rows = [mention[kept] for mention, kept in zip(queries, live, strict=True)]
    # a Zeshel world: its entities alone are candidates (each shard's slots, once a search)
    in_world = (
        None if allowed is None else [np.isin(shard.entity_rows[0], allowed) for shard in shards]
    )
    candidates, clock = [], time.perf_counter()
    for mention in rows:
        by_centroid = np.ascontiguousarray(centroids @ mention.T)  # Sᵀ [K, Q]
        probed, floor = probe(by_centroid.T, nprobe)
        found = [pruned_interaction(shard.postings, by_centroid, probed, floor) for shard in shards]
        if in_world is not None:
            found = [
                (slots[world[slots]], scores[world[slots]])
                for (slots, scores), world in zip(found, in_world, strict=True)
            ]
        kept = survivors(found, kept_by_interaction)
        clock = _lap(stage_seconds, "generation", clock)
        rescored = []
        for shard, slots in zip(shards, kept, strict=True):
            token_rows, starts = shard.candidate_rows(slots)
            scores = (
                centroid_interaction(shard.postings, by_centroid, token_rows, starts)
                if len(slots)
                else np.zeros(0, np.float32)
            )
            rescored.append((slots, scores))
        final = survivors(rescored, decoded)
        ids = [shard.entity_rows[0][slots] for shard, slots in zip(shards, final, strict=True)]
        candidates.append(np.sort(np.concatenate(ids)))
        clock = _lap(stage_seconds, "interaction", clock)
    parts = [shard.sum_of_max_top_k(rows, candidates, k) for shard in shards]
    _lap(stage_seconds, "exact", clock)
    return merge_entity_lists(parts, k)


def _lap(stage_seconds: Counter[str], stage: str, since: float) -> float:
    """Add the seconds since `since` to `stage`'s; returns now."""
    now = time.perf_counter()
    stage_seconds[stage] += now - since
    return now
