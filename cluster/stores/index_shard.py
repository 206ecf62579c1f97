"""One searchable shard of an index version: a FAISS index and the entity id of each of its
vectors, with what rescoring reads (docs/indexes.md).

A shard covers a contiguous range of entities and holds every vector of each of them (one
vector per entity for dual, m per entity for multi-m, one per token for sum-of-max), so it can
rank its own entities exactly; the shards one process holds are merged by
:class:`hnce.cluster.stores.sharded_searcher.ShardedSearcher`. Rescoring a shard's candidates by
sum-of-max (:meth:`IndexShard.sum_of_max_top_k`) reads their vectors from a flat shard's storage,
a compressed shard's float16 copy of them, or its standalone codes, decoded
(:mod:`hnce.cluster.stores.pq_codes`, :mod:`hnce.cluster.stores.plaid`). Shard files are read
memory-mapped (`hnce.cluster.stores.shard_files`), so a shard's vectors live in the page cache,
not twice in memory.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import faiss
import numpy as np

from hnce.cluster.stores.faiss_device import FaissDevice
from hnce.cluster.stores.plaid import CentroidPostings, centroid_ids, is_plaid
from hnce.cluster.stores.pq_codes import NO_TOKEN_VECTORS
from hnce.errors import InputError
from hnce.search import PAD_ID, PAD_SCORE, no_results


def stored_count(index: faiss.Index, codes: np.ndarray | None) -> int:
    """Vectors a shard holds: its FAISS index's, or a plaid shard's codes'."""
    return len(codes) if codes is not None and is_plaid(index) else int(index.ntotal)


@dataclass(frozen=True)
class CoarseAssignment:
    """Each query's `nprobe` nearest IVF lists (ids [n, nprobe]) and their centroid scores."""

    scores: np.ndarray
    lists: np.ndarray


@dataclass
class IndexShard:
    """One searchable shard: a FAISS index and the entity id of each of its vectors.

    `vectors` is the shard's stored vectors (a view of a flat CPU index's storage, `storage`, kept
    alive with it), or a compressed shard's float16 copy of them, memory-mapped; `codes` a
    compressed token shard's standalone codes (`hnce.cluster.stores.pq_codes`), which
    `storage`, the CPU index, decodes. Rescoring reads one or the other (:meth:`token_vectors`); both are None for
    other shards.
    """

    index: faiss.Index
    ids: np.ndarray  # int64 [ntotal]
    vectors: np.ndarray | None = None
    storage: faiss.Index | None = None
    codes: np.ndarray | None = None

    def __post_init__(self) -> None:
        count = stored_count(self.index, self.codes)
        if len(self.ids) != count:
            raise ValueError(f"shard has {count} vectors but {len(self.ids)} entity ids")
        if self.codes is not None and len(self.codes) != len(self.ids):
            raise ValueError(f"shard has {len(self.ids)} vectors but {len(self.codes)} codes")

    @classmethod
    def on_device(
        cls,
        index: faiss.Index,
        ids: np.ndarray,
        device: FaissDevice,
        codes: np.ndarray | None = None,
        vectors: np.ndarray | None = None,
    ) -> IndexShard:
        """A shard of the CPU `index` placed on `device`, keeping its flat storage (or the
        CPU index that decodes `codes`, or the copy of its `vectors`) readable."""
        if isinstance(index, faiss.IndexFlat):
            vectors = faiss.rev_swig_ptr(index.get_xb(), index.ntotal * index.d)
            vectors = vectors.reshape(index.ntotal, index.d)
        # a plaid index is never searched by FAISS (its lists are empty): it stays where its
        # codes are decoded, and the search's kernels run beside it (plaid module docstring)
        placed = index if is_plaid(index) else device.place(index)
        return cls(placed, ids, vectors, storage=index, codes=codes)

    @functools.cached_property
    def entity_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(entity ids, first row of each) of a shard whose ids are sorted entity by entity; an
        entity's vectors are rows ``first[e] .. first[e + 1]`` (the last up to ``ntotal``)."""
        entities, first = np.unique(self.ids, return_index=True)
        return entities, np.append(first, len(self.ids))

    def candidate_rows(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(token rows, each entity's first position among them) of the entities at `slots`
        (positions in :attr:`entity_rows`, in order): one run of rows an entity."""
        _, first = self.entity_rows
        lengths = first[slots + 1] - first[slots]
        offsets = np.cumsum(lengths) - lengths
        return np.repeat(first[slots] - offsets, lengths) + np.arange(lengths.sum()), offsets

    @functools.cached_property
    def postings(self) -> CentroidPostings:
        """A plaid shard's centroid → entity inverse, built from its codes (plaid module)."""
        if not is_plaid(self.index) or self.codes is None:
            raise ValueError("centroid postings belong to a plaid shard")
        _, first = self.entity_rows
        ivf = faiss.extract_index_ivf(self.index)
        return CentroidPostings.build(centroid_ids(self.codes, ivf), first, ivf.nlist)

    @functools.cached_property
    def centroids(self) -> np.ndarray:
        """An IVF shard's centroids (float32 [nlist, d]), read from its quantiser."""
        ivf = faiss.extract_index_ivf(self.storage if self.storage is not None else self.index)
        return ivf.quantizer.reconstruct_n(0, ivf.nlist)

    def token_vectors(self, rows: np.ndarray) -> np.ndarray:
        """The vectors of `rows` (float32 [len(rows), d]): read from flat storage, or decoded
        from a compressed shard's codes."""
        if self.vectors is not None:
            return np.asarray(self.vectors[rows], dtype=np.float32)
        if self.codes is not None and self.storage is not None:
            return self.storage.sa_decode(np.ascontiguousarray(self.codes[rows]))
        raise InputError(NO_TOKEN_VECTORS)

    def stored_vectors(self) -> np.ndarray:
        """Every vector of the shard (float32 [ntotal, d]), in id order: read from flat storage or
        the float16 copy, decoded from a compressed shard's codes, else reconstructed by FAISS
        (an HNSW graph's storage, an IVF-PQ index's codes: the approximations it searches)."""
        if self.vectors is not None or self.codes is not None:
            return self.token_vectors(np.arange(len(self.ids)))
        index = self.storage if self.storage is not None else self.index
        if isinstance(index, faiss.IndexIVF):
            index.make_direct_map()
        return index.reconstruct_n(0, index.ntotal)

    def sum_of_max_top_k(
        self, live: Sequence[np.ndarray], candidates: Sequence[np.ndarray], k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """This shard's top-k of each row's candidates (sorted entity ids, the shard's among
        them), by s = Σ_i max_j ⟨x_i, y_j⟩ over the row's `live` query vectors and each
        candidate's vectors (stored, or decoded from a compressed shard's codes): the exact
        rescoring of late interaction (Khattab & Zaharia 2020, ColBERT §3.6)."""
        out_ids, out_scores = no_results(len(live), k)
        entities, _ = self.entity_rows
        if not len(entities):
            return out_ids, out_scores
        for row, (queries, row_candidates) in enumerate(zip(live, candidates, strict=True)):
            low, high = np.searchsorted(row_candidates, [entities[0], entities[-1] + 1])
            mine = row_candidates[low:high]  # the searcher's shards cover disjoint ranges
            if not len(mine):
                continue
            rows, offsets = self.candidate_rows(np.searchsorted(entities, mine))
            token_scores = queries @ self.token_vectors(rows).T  # [live query tokens, tokens]
            # max_j per candidate (its tokens are one run of columns), then Σ_i
            scores = np.maximum.reduceat(token_scores, offsets, axis=1).sum(0)
            order = np.lexsort((mine, -scores))[:k]
            out_ids[row, : len(order)] = mine[order]
            out_scores[row, : len(order)] = scores[order]
        return out_ids, out_scores

    @property
    def rescorable(self) -> bool:
        """Whether its FAISS index ranks by approximate scores (every kind but flat) and a copy
        of its vectors is kept to rescore candidates from (compressed multi-m)."""
        cpu_index = self.storage if self.storage is not None else self.index
        return not isinstance(cpu_index, faiss.IndexFlat) and self.vectors is not None

    def search_vectors(
        self,
        queries: np.ndarray,
        depth: int,
        allowed: np.ndarray | None = None,
        coarse: CoarseAssignment | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-`depth` vector hits (entity ids, scores), best first; -1 / -inf where fewer exist.

        `allowed` (sorted entity ids) restricts the search to those entities' vectors. `coarse`
        is the queries' IVF lists, already found by the quantiser this shard shares
        (`hnce.cluster.stores.sharded_searcher.shared_quantizer`): its lists are scanned without
        searching the quantiser again.
        """
        depth = min(depth, self.index.ntotal)
        empty = no_results(len(queries), 0)
        if depth == 0:
            return empty
        params = None
        if allowed is not None:
            positions = np.flatnonzero(np.isin(self.ids, allowed))
            if positions.size == 0:
                return empty
            params = _restricted(self.index, faiss.IDSelectorBatch(positions.astype(np.int64)))
        if coarse is None:
            scores, positions = self.index.search(queries, depth, params=params)
        else:
            scores, positions = self.index.search_preassigned(
                queries, depth, coarse.lists, coarse.scores, params=params
            )
        found = positions >= 0
        labels = np.where(found, self.ids[np.maximum(positions, 0)], PAD_ID)
        return labels, np.where(found, scores, PAD_SCORE).astype(np.float32)


def _restricted(index: faiss.Index, selector: faiss.IDSelector) -> faiss.SearchParameters:
    """Search parameters that keep `index`'s own knobs and add an id selector."""
    if isinstance(index, faiss.IndexIVF):
        return faiss.SearchParametersIVF(sel=selector, nprobe=index.nprobe)
    if isinstance(index, faiss.IndexHNSW):
        return faiss.SearchParametersHNSW(sel=selector, efSearch=index.hnsw.efSearch)
    return faiss.SearchParameters(sel=selector)
