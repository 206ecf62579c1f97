"""The one shape of a top-k search over the entity catalogue, and the merge of several results.

Every searcher of hnce — a process's FAISS shards (``hnce.cluster.stores.sharded_searcher``, dual,
multi-m and the sum-of-max token index), the exact scorer's shards
(``hnce.cluster.stores.exact_search``), the shards held by the encoder actors
(``hnce.cluster.compute.shard_holders``), the linker's open index
(``hnce.cluster.compute.retrieval``), BM25 (``hnce.mining.samplers.lexical``) — answers
:meth:`Searcher.search` ``(queries, k) -> (ids, scores)``, in the spirit of PyLate's
``indexes/base.py``:

- ``ids``: int64 ``[n, k]``, the entity ids of each query's k best entities, best first. An
  entity id is the entity's row of the catalogue (``entity_id`` i is row i of the dataset's
  entity files, the row of its token store and the id an index shard records).
- ``scores``: float32 ``[n, k]``, the score the searcher ranks by (eq. 9 of Zhang & Stratos 2021
  for the bi-encoder's scorers, docs/math.md; BM25 for the lexical index), descending.
- A row with fewer than k entities to give (a small catalogue, a search restricted to a Zeshel
  world, BM25 entities that share no term with the mention) is padded on the right with id
  ``PAD_ID`` (-1) and score ``PAD_SCORE`` (-inf); every padded cell is both.

What a query is depends on the searcher (the type parameter): query vectors for the index
searchers, mentions for the linker's index, mention strings for BM25. Anything else a search
takes (the entities a Zeshel world allows, a batch size) is a keyword-only argument or the
searcher's own state, so a caller may hold any searcher of its query type.

Results of searchers over disjoint parts of the catalogue (the shards of one process, the
holders of one version) are merged by :func:`merge_entity_lists`, which is exact because every
entity lies in one part.

Example::

    def recall_at(searcher: Searcher[np.ndarray], queries: np.ndarray, gold: np.ndarray) -> float:
        ids, _ = searcher.search(queries, 64)
        return float((ids == gold[:, None]).any(axis=1).mean())
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar, runtime_checkable

import numpy as np

#: the id and the score of a padded cell of a search result
PAD_ID = -1
PAD_SCORE = float("-inf")

Query = TypeVar("Query", contravariant=True)


@runtime_checkable
class Searcher(Protocol[Query]):
    """Anything that gives the top-k entities of a batch of queries (module docstring)."""

    def search(self, queries: Query, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(entity ids int64 [n, k], scores float32 [n, k]) of the n queries, best first,
        padded with ``PAD_ID`` / ``PAD_SCORE`` where fewer than k entities are found."""
        ...


def no_results(rows: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """A result of `rows` rows and `k` columns, every cell padding."""
    return np.full((rows, k), PAD_ID, dtype=np.int64), np.full((rows, k), PAD_SCORE, np.float32)


def first_distinct(ids: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the first k distinct entity ids of a best-first hit list (each entity at its first,
    i.e. best, score); padded where fewer exist. Vectorised over rows."""
    order = np.argsort(ids, axis=1, kind="stable")  # equal ids stay in best-first order
    sorted_ids = np.take_along_axis(ids, order, axis=1)
    first = np.ones_like(sorted_ids, dtype=bool)
    first[:, 1:] = sorted_ids[:, 1:] != sorted_ids[:, :-1]
    keep = np.zeros_like(first)
    np.put_along_axis(keep, order, first, axis=1)
    keep &= ids >= 0
    rank = np.cumsum(keep, axis=1) - 1
    keep &= rank < k
    out_ids, out_scores = no_results(len(ids), k)
    row_index, column = np.nonzero(keep)
    out_ids[row_index, rank[keep]] = ids[row_index, column]
    out_scores[row_index, rank[keep]] = scores[row_index, column]
    return out_ids, out_scores


def merge_entity_lists(
    parts: Sequence[tuple[np.ndarray, np.ndarray]], k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-shard (or per-holder) top-k entity lists into the top-k overall, best first.

    Each part is (entity ids [B, k_i], scores [B, k_i]), padded with -1 / -inf. Entities are
    disjoint across parts for a verified index; an entity listed twice keeps its best score.
    """
    ids = np.concatenate([part[0] for part in parts], axis=1)
    scores = np.concatenate([part[1] for part in parts], axis=1).astype(np.float32)
    order = np.argsort(-scores, axis=1, kind="stable")
    ids = np.take_along_axis(ids, order, axis=1)
    scores = np.take_along_axis(scores, order, axis=1)
    return first_distinct(ids, scores, k)
