"""Brute-force multi-vector scores of every query against every entity, the references the
compressed indexes' searches are checked against (docs/math.md: sum-of-max and multi-m)."""

from __future__ import annotations

import numpy as np

#: entity vectors scored at once (bounds the [query tokens, vectors] matrix of one query)
CHUNK_VECTORS = 1_000_000


def _chunks(ids: np.ndarray) -> list[tuple[slice, np.ndarray, slice]]:
    """(vector rows, each entity's first column within them, entity columns) of whole-entity
    chunks of about CHUNK_VECTORS vectors; `ids` sorted, one run of vectors per entity."""
    first = np.unique(ids, return_index=True)[1]
    bounds = np.append(first, len(ids))
    per_chunk = max(1, CHUNK_VECTORS * len(first) // len(ids))
    chunks = []
    for start in range(0, len(first), per_chunk):
        stop = min(start + per_chunk, len(first))
        rows = slice(int(bounds[start]), int(bounds[stop]))
        chunks.append((rows, first[start:stop] - bounds[start], slice(start, stop)))
    return chunks


def sum_of_max(queries: np.ndarray, vectors: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """s(x, y) = Σ_i max_j ⟨x_i, y_j⟩ of every query [B, Q, d] against every entity: [B, E],
    padded (all-zero) query rows left out."""
    chunks = _chunks(ids)
    scores = np.zeros((len(queries), chunks[-1][2].stop), np.float32)
    for row, query in enumerate(queries):
        live = query[np.abs(query).sum(axis=1) > 0]
        for rows, offsets, columns in chunks:
            token_scores = live @ vectors[rows].T
            scores[row, columns] = np.maximum.reduceat(token_scores, offsets, axis=1).sum(axis=0)
    return scores


def max_over_vectors(queries: np.ndarray, vectors: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """s(x, y) = max_t ⟨x, y_t⟩ of every query [B, d] against every entity: [B, E]."""
    return np.concatenate(
        [
            np.maximum.reduceat(queries @ vectors[rows].T, offsets, axis=1)
            for rows, offsets, _ in _chunks(ids)
        ],
        axis=1,
    )


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    """Mean share of each query's exact top-k (rows of `exact`) among its found entities."""
    return float(
        np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(found, exact, strict=True)])
    )
