"""Token pooling at index time: fewer token vectors an entity for sum-of-max (Clavié et al. 2024,
*Reducing the Footprint of Multi-Vector Retrieval with Minimal Performance Impact via Token
Pooling*; ``index.token_pool_factor``, docs/engines.md).

An entity's token vectors y_2..y_n are clustered hierarchically (Ward's linkage, the paper's
best method) into ⌈(n − 1) / f⌉ clusters, and each cluster is replaced by the mean of its
vectors; y_1, the first vector that som scores against every query token as any other (and
that multi-m and dual read alone), is kept as it is, as the paper keeps its protected tokens.
A pool factor f = 2 removes about half of the vectors (the paper: with little loss of
retrieval quality). f = 1 leaves every vector. Sum-of-max over pooled vectors is the same score
function (eq. 9) over fewer, averaged keys.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage


def pool_tokens(vectors: np.ndarray, ids: np.ndarray, factor: int) -> tuple[np.ndarray, np.ndarray]:
    """(pooled vectors, their entity ids) of token `vectors` [T, d] whose entity `ids` [T] run
    entity by entity; each entity's first vector kept, its others pooled by `factor`."""
    if factor == 1 or not len(ids):
        return vectors, ids
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    stops = np.append(starts[1:], len(ids))
    pooled, pooled_ids = [], []
    for start, stop in zip(starts, stops, strict=True):
        pooled.append(vectors[start : start + 1])
        rest = vectors[start + 1 : stop]
        if len(rest) > 1:
            clusters = math.ceil(len(rest) / factor)
            labels = fcluster(linkage(rest, method="ward"), clusters, criterion="maxclust")
            _, cluster = np.unique(labels, return_inverse=True)
            sums = np.zeros((cluster.max() + 1, rest.shape[1]), dtype=np.float64)
            np.add.at(sums, cluster, rest)
            rest = (sums / np.bincount(cluster)[:, None]).astype(vectors.dtype)
        pooled.append(rest)
        pooled_ids.append(np.full(1 + len(rest), ids[start], dtype=ids.dtype))
    return np.concatenate(pooled), np.concatenate(pooled_ids)
