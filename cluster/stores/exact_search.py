"""Exact top-k over the shards one holder holds, for scorers whose query depends on the entity
(poly-m, genpoly-m, the general form; docs/math.md: hard negatives mined "exactly over the
whole catalogue when it is small").

An inner-product search cannot rank such entities, so their index shards are flat FAISS files
that store each entity's reduced vectors (``Scorer.entity_index_vectors``: the kept output of
``reduce_entities``, one vector per entity for poly-m). A holder scores every held entity against
the mention's reduced vectors (``reduce_mentions``, encoded by the same model in the encoder
actors) with the scorer itself (eq. 9 through ``score_reduced``), a chunk of entities at a time
so memory stays bounded by one chunk, keeps each chunk's top-k and merges them
(`hnce.search.merge_entity_lists`), exactly as the orchestrator merges the holders' lists. The
cost is one score per mention-entity pair: see the README ("Exact mining") for the catalogue size
at which it becomes too slow.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from hnce.cluster.stores.index_shard import IndexShard
from hnce.encoders.scorers import Scorer, exact_index_scores
from hnce.errors import InputError
from hnce.search import PAD_ID, PAD_SCORE, Searcher, merge_entity_lists

# Entities scored per chunk: bounds the grouped vectors and the [B, chunk] scores held at once.
ENTITIES_PER_CHUNK = 4096


class ExactSearcher(Searcher[np.ndarray]):
    """The shards one process holds of an exact scorer's version; ranks every entity exactly
    (a `hnce.search.Searcher` of the mentions' reduced query vectors).

    Args:
        shards: flat shards on the CPU (their stored vectors are read in place, memory-mapped).
        scorer: the scorer of the model the version was encoded with.
        device: where the scores are computed (the holder's model device).
        entities_per_chunk: entities scored at once.
    """

    def __init__(
        self,
        shards: Sequence[IndexShard],
        scorer: Scorer,
        device: torch.device,
        entities_per_chunk: int = ENTITIES_PER_CHUNK,
    ) -> None:
        if not shards:
            raise ValueError("an exact searcher needs at least one shard")
        if any(shard.vectors is None for shard in shards):
            raise InputError(
                f"exact {scorer.name} scoring needs flat shards (stored vectors); set index.kind: flat"
            )
        self.shards = list(shards)
        self.scorer = scorer
        self.device = device
        self.entities_per_chunk = entities_per_chunk
        self.ntotal = sum(shard.index.ntotal for shard in self.shards)

    @torch.inference_mode()
    def search(
        self, queries: np.ndarray, k: int, *, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k entities per mention: (entity ids int64 [B, k], scores float32 [B, k]).

        `queries` [B, a, d] are ``mention_query_vectors`` (zero rows masked); `allowed` (entity
        ids) restricts the ranking to those entities. Padded with -1 / -inf.
        """
        query_vectors = torch.from_numpy(np.asarray(queries, np.float32)).to(self.device)
        parts = []
        for shard in self.shards:
            parts.extend(self._shard_chunks(shard, query_vectors, k, allowed))
        return merge_entity_lists(parts, k)

    def _shard_chunks(
        self, shard: IndexShard, queries: torch.Tensor, k: int, allowed: np.ndarray | None
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each chunk's top-k of one shard (entity ids sorted, an entity's vectors one slice)."""
        assert shard.vectors is not None
        entities, bounds = shard.entity_rows
        parts = []
        for first in range(0, len(entities), self.entities_per_chunk):
            last = min(first + self.entities_per_chunk, len(entities))
            rows = slice(int(bounds[first]), int(bounds[last]))
            ids, scores = exact_index_scores(
                self.scorer,
                queries,
                torch.from_numpy(np.asarray(shard.vectors[rows])).to(self.device),
                torch.from_numpy(np.array(shard.ids[rows])).to(self.device),
            )
            if allowed is not None:
                admitted = torch.from_numpy(np.isin(entities[first:last], allowed))
                scores = scores.masked_fill(~admitted.to(self.device), PAD_SCORE)
            top = scores.float().topk(min(k, scores.shape[1]), dim=1)
            top_ids = ids[top.indices]
            top_ids = top_ids.masked_fill(top.values == PAD_SCORE, PAD_ID)
            parts.append((top_ids.cpu().numpy(), top.values.cpu().numpy()))
        return parts
