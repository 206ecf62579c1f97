"""A shard's FAISS index, trained and built on the CPU per the recipe's ``index`` section
(:class:`hnce.cluster.stores.index_spec.IndexSpec`; docs/indexes.md).

Built on the CPU so the bytes written to the store do not depend on the device; searching places
it on the device (`hnce.cluster.stores.faiss_device`). A quantised kind (ivfpq, plaid) trains one
quantiser a version, on a sample of the whole catalogue, and every shard of the version is built
on a copy of it (`hnce.cluster.compute.index_build`).
"""

from __future__ import annotations

import faiss
import numpy as np

from hnce.cluster.stores.index_spec import (
    HNSW_EF_SEARCH,
    HNSW_M,
    PQ_BITS,
    PQ_CENTROIDS,
    IndexSpec,
)
from hnce.cluster.stores.plaid import plaid_quantizer
from hnce.errors import InputError


def build_shard_index(
    vectors: np.ndarray, spec: IndexSpec, seed: int = 0, trained: faiss.Index | None = None
) -> faiss.Index:
    """A CPU FAISS index over `vectors` [n, d] (float32, inner product), built per `spec`.

    Deterministic for a given input and seed. An IVF-PQ shard adds its vectors to a copy of
    `trained`, the quantiser its version trained once on a sample of the whole catalogue
    (`train_index`; the encoder actors' builds always pass one); without it, to a quantiser
    trained on a sample of `vectors` alone.
    """
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if vectors.ndim != 2:
        raise ValueError(f"shard vectors must be [n, d], got shape {vectors.shape}")
    index = train_index(vectors, spec, seed) if trained is None else faiss.clone_index(trained)
    index.add(vectors)
    return index


def train_index(sample: np.ndarray, spec: IndexSpec, seed: int = 0) -> faiss.Index:
    """An empty index of kind `spec.kind`, trained on `sample` where the kind needs training."""
    vectors = np.ascontiguousarray(sample, dtype=np.float32)
    dim = vectors.shape[1]
    if spec.kind == "flat":
        index: faiss.Index = faiss.IndexFlatIP(dim)
    elif spec.kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efSearch = HNSW_EF_SEARCH
    else:
        if (problem := spec.width_problem(dim)) is not None:  # the recipe check names it first
            raise InputError(f"'index.pq_m' {problem}")
        if len(vectors) < PQ_CENTROIDS:
            raise InputError(
                f"{spec.kind} trains {PQ_CENTROIDS} centroids per sub-quantiser on at least "
                f"{PQ_CENTROIDS} vectors, and the catalogue's sample has {len(vectors)}; for a "
                f"catalogue this small set index.kind: flat"
            )
        # FAISS wants ~39 training points per centroid; fewer lists for a small sample.
        nlist = max(1, min(spec.nlist, len(vectors) // 39))
        quantizer = plaid_quantizer(dim) if spec.kind == "plaid" else faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFPQ(
            quantizer, dim, nlist, spec.pq_m, PQ_BITS, faiss.METRIC_INNER_PRODUCT
        )
        index.cp.seed = seed
        index.pq.cp.seed = seed
        rng = np.random.default_rng(seed)
        train = vectors
        if len(vectors) > spec.train_size:
            train = vectors[np.sort(rng.choice(len(vectors), spec.train_size, replace=False))]
        index.train(train)
        index.nprobe = spec.probes
    return index
