"""PLAID's token index and its search kernels (Santhanam et al. 2022, *PLAID: An Efficient
Engine for Late Interaction Retrieval*, §4; docs/indexes.md, "The plaid token index").

A plaid shard stores each entity token as its centroid id and the product code of its residual
(ColBERTv2's compression, §3.3 there), in entity order: FAISS's standalone IVF-PQ code
(``sa_encode``), whose first bytes are the centroid id. The centroids (2^16 and more at scale)
are one FAISS IVF-PQ quantiser per index version, shared by its shards; a token is placed
through an HNSW graph of them (a few µs a token where a flat quantiser's cost grows with the
centroids). Its IVF lists stay empty: no code is ever scanned to find candidates. In memory a
shard adds :class:`CentroidPostings`, its inverse: the entities that hold a token of each
centroid (PLAID's ``ivf.pid``), built from the codes when the shard is loaded.

Sum-of-max s(x, y) = Σ_i max_j ⟨x_i, y_j⟩ (eq. 9 of Zhang & Stratos 2021) is searched in
PLAID's four stages, each narrower than the last, over the shards one holder holds:

1. **Candidate generation**: S = Q·Cᵀ scores each query token against every centroid; each
   query token probes its `nprobe` best centroids, and the entities holding a token of any
   probed centroid are the candidates.
2. **Centroid interaction with pruning**: s̃₂(y) = Σ_i max(max_{c ∈ C(y) ∩ P} S[i, c], m_i),
   where C(y) are y's centroids, P the probed ones (PLAID's pruning keeps only centroids near
   the query: here those some query token probed, a rank rather than PLAID's score threshold
   t_cs, since hnce's vectors need not be unit length) and m_i query token i's lowest probed
   centroid score, the most a centroid it did not probe can score (XTR's imputation, Lee et al.
   2023, as WARP uses it). Computed from the postings of P alone: no entity's tokens are read.
   The best `candidate_depth` entities survive (PLAID's ndocs).
3. **Centroid interaction**: s̃₃(y) = Σ_i max_j S[i, c(y_j)] over every token's centroid id (no
   residual is decoded); the best quarter survive (PLAID's ndocs/4).
4. **Exact scoring**: the survivors' residuals are decoded (centroid + residual), or read from
   the float16 token copy (``index.token_copy``), and s(x, y) is computed on them
   (``sharded_index._rescored_top_k``).

Multi-m (s = max_t ⟨x, y_t⟩) is the same search with one query vector, its m vectors an entity
stored as tokens. With every centroid probed and every entity surviving, the result is exact
sum-of-max over the decoded tokens (``tests/test_cluster_plaid.py`` holds it to that).

The kernels are numpy on the CPU, vectorised over one mention's pairs of (entity, centroid).
"""

from __future__ import annotations

from dataclasses import dataclass

import faiss
import numpy as np


def centroid_ids(codes: np.ndarray, index: faiss.IndexIVF) -> np.ndarray:
    """The centroid of each token (int64 [n]) from its standalone codes (uint8 [n, code size]):
    FAISS writes the list number first, little-endian, in ``coarse_code_size()`` bytes."""
    width = index.coarse_code_size()
    places = np.array([1 << (8 * byte) for byte in range(width)], dtype=np.int64)
    return np.asarray(codes[:, :width], dtype=np.int64) @ places


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
