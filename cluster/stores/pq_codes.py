"""Standalone product-quantisation codes of token vectors on a version's IVF-PQ quantiser
(ColBERTv2's compression, Santhanam et al. 2022, §3.3; docs/indexes.md, "Compressed sum-of-max").

A compressed sum-of-max shard keeps each token vector twice: in its IVF lists, which propose the
candidates, and in entity order as its standalone code (FAISS's ``sa_encode`` format: the list
number, then the residual's product code), which rescoring decodes for the candidates only
(:meth:`hnce.cluster.stores.index_shard.IndexShard.token_vectors`). A plaid shard keeps the codes
alone (:func:`hnce.cluster.stores.plaid.plaid_codes`).
"""

from __future__ import annotations

import faiss
import numpy as np
from faiss.contrib.ivf_tools import add_preassigned

from hnce.errors import InputError

NO_TOKEN_VECTORS = (
    "sum-of-max rescoring needs a flat, ivfpq or plaid token index; set index.kind: flat, ivfpq "
    "or plaid"
)


def token_codes(index: faiss.Index, vectors: np.ndarray) -> np.ndarray:
    """The standalone codes (uint8 [n, code size], FAISS ``sa_encode``) of `vectors` that a
    compressed token shard keeps beside its IVF lists, so that sum-of-max rescoring can decode
    any entity's tokens (module docstring). Only IVF-PQ has them: flat shards rescore from their
    storage, and sum-of-max over HNSW is refused."""
    if not isinstance(index, faiss.IndexIVFPQ):
        raise InputError(NO_TOKEN_VECTORS)
    return index.sa_encode(np.ascontiguousarray(vectors, dtype=np.float32))


def add_token_codes(index: faiss.Index, vectors: np.ndarray) -> np.ndarray:
    """`vectors` added to the IVF-PQ `index`'s lists, and their standalone codes
    (:func:`token_codes`), each vector assigned to its list once for both: ``add`` and
    ``sa_encode`` would each search the quantiser, the larger part of a compressed build's time
    (16,384 lists at d = 32: 24 µs of 27 a token on one core). Same index bytes and codes as
    ``index.add(vectors)`` then ``token_codes(index, vectors)``."""
    vectors, lists, codes = assigned_codes(index, vectors)
    add_preassigned(index, vectors, lists)
    return codes


def assigned_codes(
    index: faiss.Index, vectors: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(`vectors` as contiguous float32, each one's list, its standalone code) on an IVF-PQ
    `index`, each vector assigned once. The code is FAISS's ``encode_vectors`` format (the list
    number in ``coarse_code_size()`` little-endian bytes, then the residual's product code),
    computed here from the residuals in one ``pq.compute_codes`` call: FAISS's own loop took 19
    µs a token (d = 32, pq_m 32), the product quantiser's 1."""
    if not isinstance(index, faiss.IndexIVFPQ):
        raise InputError(NO_TOKEN_VECTORS)
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    _, nearest = index.quantizer.search(vectors, 1)
    lists = np.ascontiguousarray(nearest[:, 0])
    residuals = vectors - index.quantizer.reconstruct_batch(lists)
    width = index.coarse_code_size()
    list_bytes = (lists[:, None] >> (8 * np.arange(width))) & 0xFF
    codes = np.concatenate([list_bytes.astype(np.uint8), index.pq.compute_codes(residuals)], axis=1)
    return vectors, lists, np.ascontiguousarray(codes)
