"""The searcher of the shards one process holds, which merges their entity lists (docs/indexes.md,
docs/engines.md).

Each shard is one FAISS index plus an `ids` array giving the entity id of every vector in it
(one vector per entity for dual, m per entity for multi-m, one per token for sum-of-max;
`hnce.cluster.stores.index_shard.IndexShard`). A shard
covers a contiguous range of entities and holds every vector of each of them, so each shard can
rank its own entities exactly and a search is a merge of per-shard entity top-k lists
(`hnce.search.merge_entity_lists`): the same merge joins the shards one process holds
(:class:`ShardedSearcher`, searched one after another: on a 2-core machine threaded
`IndexShards` is slower than sequential search, docs/engines.md) and the lists of several shard-holder
actors (`hnce.cluster.compute.shard_holders`).

Score functions (docs/math.md, eq. 9 of Zhang & Stratos 2021), per shard:

- dual: s(x, y) = ⟨x_1, y_1⟩ — one vector per entity; the top-k vectors are the top-k entities.
- multi-m: s(x, y) = max_{t≤m} ⟨x_1, y_t⟩ — the shard holds m vectors per entity. Walking vector
  hits in descending score order, an entity's first hit is its max, so the first k distinct
  entities are exactly the top-k entities; and the top k·m vector hits contain at least k distinct
  entities (each contributes at most m). Searching a flat shard k·m vectors deep is therefore
  exact. A compressed shard (`ivfpq`, `hnsw`) ranks by approximate scores, which at 8-bit codes
  keep a quarter of the exact top-100 (BENCHMARKS.md); it proposes candidates instead (the
  entities of the mention's `max(candidate_depth, k·m)` nearest vectors), and the candidates are
  rescored exactly from a float16 copy of the shard's vectors kept on disk and memory-mapped
  (`IndexShard.vectors`): max_t ⟨x_1, y_t⟩ is sum-of-max with one query vector, so it is the
  same late-interaction rescoring as below (`IndexShard.sum_of_max_top_k`), reading the
  candidates' rows only.
- som: s(x, y) = Σ_i max_j ⟨x_i, y_j⟩ — the token-level shards propose candidates (each query
  token's `candidate_depth` nearest entity tokens: ColBERT's k' per query embedding, 1,000 in
  its end-to-end retrieval), then each candidate is rescored in its shard from its token vectors
  (late interaction, Khattab & Zaharia 2020, ColBERT §3.6 and §4.4). A flat shard rescores from
  its stored vectors, so the result is exact whenever `candidate_depth` covers what one index
  would need. An `ivfpq` token shard is the compressed index of ColBERTv2 (Santhanam et
  al. 2022, §3.3): each token vector is stored as its IVF centroid plus a product-quantised
  residual, once in the IVF lists (candidate generation) and once in entity order as standalone
  codes (`IndexShard.codes`, `hnce.cluster.stores.pq_codes`), which rescoring decodes for the
  candidates only; the full-precision token vectors are never held. With `index.token_copy`
  the shard keeps, instead of those codes, a float16 copy of its token vectors on disk,
  memory-mapped, as compressed multi-m does: the candidates' scores are then exact (up to
  float16), so recall is bounded by candidate generation alone, at 2·d bytes a token on disk
  (BENCHMARKS.md).

- plaid (som and multi-m): PLAID's token index, searched in its stages (candidates from the
  query tokens' nearest centroids, centroid interaction with and without pruning, exact scoring
  of the survivors' decoded residuals), :mod:`hnce.cluster.stores.plaid`; its shards share the
  version's quantiser, which holds their centroids, and keep their tokens' codes alone.

Candidates (sum-of-max and compressed multi-m above) are the `candidate_depth` best hits across
all the shards one process holds, not per shard: the hits of one index over them, since their approximate scores
come from the version's one quantiser. So a holder rescores at most Q·`candidate_depth` entities
a mention however many shards it holds (237 at 5.9M entities); per shard, the candidates, and
the time to rescore them, would grow with the catalogue. For the same reason the shared
quantiser is searched once per query for all the shards a process holds, and each shard scans
the lists it found (FAISS's ``search_preassigned``, :func:`shared_quantizer`), for every scorer.

Because every entity lives in one shard, merging per-shard top-k lists by score is exact. Scorers
whose query depends on the entity (poly-m, genpoly-m, general) are not searched here: their flat
shards store reduced entity vectors scored by the scorer itself (`hnce.cluster.stores.exact_search`).

:class:`ShardedSearcher` is a `hnce.search.Searcher` of query vectors: the same search shape
and padding as every other searcher of the catalogue. The device a shard is searched on is
chosen in one place (`hnce.cluster.stores.faiss_device`).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence

import faiss
import numpy as np

from hnce.cluster.stores.index_shard import CoarseAssignment, IndexShard
from hnce.cluster.stores.plaid import is_plaid, plaid_search
from hnce.search import Searcher, merge_entity_lists


def shared_quantizer(shards: Sequence[IndexShard]) -> faiss.IndexIVF | None:
    """The IVF index of the first shard when every shard is a CPU IVF index on the same
    quantiser (the same centroids and `nprobe`: a version's shards share one, trained on the
    catalogue's sample), else None. Its quantiser is then searched once per query for all the
    shards (FAISS ``search_preassigned``), not once in each: at 237 shards and 16,384 lists that
    search alone would cost a mention's 32 query tokens 4·10⁹ multiply-adds."""
    indexes = [shard.index for shard in shards]
    if len(indexes) < 2 or not all(isinstance(index, faiss.IndexIVF) for index in indexes):
        return None
    first = indexes[0]
    centroids = first.quantizer.reconstruct_n(0, first.nlist)
    for index in indexes[1:]:
        if (index.nlist, index.nprobe) != (first.nlist, first.nprobe) or not np.array_equal(
            index.quantizer.reconstruct_n(0, index.nlist), centroids
        ):
            return None
    return first


class ShardedSearcher(Searcher[np.ndarray]):
    """The shards one process holds; ranks each shard's entities and merges the lists (sum-of-max
    and compressed multi-m: candidates from all the shards' hits, module docstring). A
    `hnce.search.Searcher` of query vectors: dual, multi-m, and with ``vectors_per_entity``
    None the token index of late interaction (sum-of-max).

    Args:
        shards: the shards (already placed on their device); each holds every vector of the
            entities it covers, and no two shards cover the same entity.
        vectors_per_entity: 1 (dual), m (multi-m) or None (one vector per token: sum-of-max).
        candidate_depth: sum-of-max: entity tokens retrieved per query token, across every
            shard here, before the exact rescoring; compressed multi-m: vectors retrieved
            (at least k·m); plaid: entities kept by the pruned centroid interaction (at least
            4k) (`index.candidate_depth`).
    """

    def __init__(
        self,
        shards: Sequence[IndexShard],
        vectors_per_entity: int | None = 1,
        candidate_depth: int = 256,
    ) -> None:
        if not shards:
            raise ValueError("a sharded index needs at least one shard")
        if vectors_per_entity is not None and vectors_per_entity < 1:
            raise ValueError(f"vectors_per_entity must be >= 1 or None, got {vectors_per_entity}")
        self.shards = list(shards)
        self.vectors_per_entity = vectors_per_entity
        self.candidate_depth = candidate_depth
        self.dim = self.shards[0].index.d
        self.ntotal = sum(shard.index.ntotal for shard in self.shards)
        _check_disjoint(self.shards)
        if len({shard.rescorable for shard in self.shards}) > 1:
            raise ValueError("the shards of one index must all be compressed, or none")
        plaid = {is_plaid(shard.index) for shard in self.shards}
        if len(plaid) > 1:
            raise ValueError("the shards of one index must all be plaid shards, or none")
        self.plaid = plaid == {True}
        #: seconds spent in each of PLAID's stages by this searcher (generation: candidates and
        #: their pruned centroid interaction; interaction; exact: decoding and exact scoring)
        self.stage_seconds: Counter[str] = Counter()
        self.quantized = shared_quantizer(self.shards)
        if self.plaid:
            if len(self.shards) > 1 and self.quantized is None:
                raise ValueError("plaid shards must share their version's one quantiser")
            for shard in self.shards:  # held means ready to search: the inverse is built now
                _ = shard.postings

    def search(
        self, queries: np.ndarray, k: int, *, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k entities per query: (entity_ids int64 [B, k], scores float32 [B, k]), best
        first (`hnce.search.Searcher`).

        `queries` is [B, d], or [B, Q, d] (Q = 1 for dual / multi-m; Q query tokens for
        sum-of-max, zero rows for padding). `allowed` (entity ids) restricts the search to those
        entities (a Zeshel world). Rows with fewer than k entities are padded with id -1 and
        score -inf.
        """
        queries = self._shape(queries)
        if self.plaid:
            tokens = queries if queries.ndim == 3 else queries[:, None, :]
            return plaid_search(
                self.shards, tokens, k, self.candidate_depth, allowed, self.stage_seconds
            )
        if self.vectors_per_entity is None:
            return self._late_interaction(queries, k, self.candidate_depth, allowed)
        depth = k * self.vectors_per_entity
        if self.rescored:
            # compressed multi-m: candidates, rescored exactly (module docstring)
            depth = max(self.candidate_depth, depth)
            return self._late_interaction(queries[:, None, :], k, depth, allowed)
        # k·m vector hits hold each shard's top-k entities (module docstring); the merge keeps
        # each entity's first, i.e. best, hit.
        coarse = self._coarse(queries, allowed)
        parts = [shard.search_vectors(queries, depth, allowed, coarse) for shard in self.shards]
        return merge_entity_lists(parts, k)

    def _shape(self, queries: np.ndarray) -> np.ndarray:
        """Queries as [B, d] for dual / multi-m, [B, Q, d] for sum-of-max (float32, contiguous)."""
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if self.vectors_per_entity is None:
            queries = queries[:, None, :] if queries.ndim == 2 else queries
        elif queries.ndim == 3:
            if queries.shape[1] != 1:
                raise ValueError(f"one query vector per mention expected, got {queries.shape}")
            queries = queries[:, 0]
        if queries.shape[-1] != self.dim:
            raise ValueError(f"query vectors must have dim {self.dim}, got {queries.shape}")
        return np.ascontiguousarray(queries)

    def _late_interaction(
        self, queries: np.ndarray, k: int, depth: int, allowed: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Sum-of-max over every shard held here: each query token's `depth` best vector hits
        across the shards (one index's hits: the shards' approximate scores share one quantiser),
        their entities rescored in their own shards (`IndexShard.sum_of_max_top_k`), then merged."""
        batch, num_query, dim = queries.shape
        live = np.abs(queries).sum(axis=2) > 0  # [B, Q]: a padded row would hit noise
        searched = np.flatnonzero(live.ravel())
        flat = np.ascontiguousarray(queries.reshape(batch * num_query, dim)[searched])
        coarse, hits = self._coarse(flat, allowed), None
        for shard in self.shards:
            found = shard.search_vectors(flat, depth, allowed, coarse)
            hits = found if hits is None else best_hits([hits, found], depth)
        bounds = np.searchsorted(searched // num_query, np.arange(batch + 1))  # rows a mention
        candidates = [
            np.unique(block[block >= 0])
            for block in (hits[0][start:stop] for start, stop in itertools.pairwise(bounds))
        ]
        rows = [mention[kept] for mention, kept in zip(queries, live, strict=True)]
        parts = [shard.sum_of_max_top_k(rows, candidates, k) for shard in self.shards]
        return merge_entity_lists(parts, k)

    def _coarse(self, queries: np.ndarray, allowed: np.ndarray | None) -> CoarseAssignment | None:
        """The queries' IVF lists from the shards' shared quantiser, or None without one. A
        search restricted to `allowed` entities (a Zeshel world) lets each shard search its own
        lists: FAISS's Python ``search_preassigned`` takes no id selector."""
        if self.quantized is None or allowed is not None:
            return None
        scores, lists = self.quantized.quantizer.search(queries, self.quantized.nprobe)
        return CoarseAssignment(scores, lists)

    @property
    def rescored(self) -> bool:
        """Whether the shards are compressed multi-m shards, whose candidates are rescored from
        a copy of their vectors."""
        return self.vectors_per_entity is not None and self.shards[0].rescorable


def _check_disjoint(shards: Sequence[IndexShard]) -> None:
    """Shards must cover disjoint entity ranges (the merge relies on each entity being in one)."""
    ranges = sorted(
        (int(shard.ids.min()), int(shard.ids.max())) for shard in shards if len(shard.ids)
    )
    for (_, last), (first, _) in itertools.pairwise(ranges):
        if first <= last:
            raise ValueError(
                f"shards overlap in entity ids ({first} <= {last}): every entity's vectors must "
                f"lie in one shard"
            )


def best_hits(
    parts: Sequence[tuple[np.ndarray, np.ndarray]], depth: int
) -> tuple[np.ndarray, np.ndarray]:
    """The `depth` best of several hit lists (ids, scores [N, ·] each), per row, in no order;
    rows with fewer keep them all (padding -1 / -inf included)."""
    ids = np.concatenate([part[0] for part in parts], axis=1)
    scores = np.concatenate([part[1] for part in parts], axis=1)
    if ids.shape[1] <= depth:
        return ids, scores
    keep = np.argpartition(-scores, depth - 1, axis=1)[:, :depth]
    return np.take_along_axis(ids, keep, axis=1), np.take_along_axis(scores, keep, axis=1)
