"""Small, real store versions for tests: an index version of given vectors, a negatives split."""

from __future__ import annotations

import numpy as np

from hnce.cluster.stores.index_store import BuildParameters, IndexStore, IndexVersion
from hnce.cluster.stores.negatives_store import MinedSplit
from hnce.cluster.stores.sharded_index import IndexSpec, build_shard_index


def index_parameters(checkpoint: int = 1, num_entities: int = 60) -> BuildParameters:
    """Build parameters of a dual, 16-dimensional version of ``num_entities`` entities."""
    return BuildParameters(
        checkpoint=checkpoint,
        checkpoint_path=f"checkpoints/step-{checkpoint}",
        model=f"{checkpoint:064x}",
        catalogue="c" * 64,
        source="encoded",
        scorer={"name": "dual"},
        dim=16,
        vectors_per_entity=1,
        num_entities=num_entities,
        index={**IndexSpec().to_json(), "shard_size": 20},
    )


def publish_index(
    store: IndexStore, checkpoint: int, vectors: np.ndarray, shards: int = 3
) -> IndexVersion:
    """Publish ``vectors`` (one per entity, [N, 16]) as a version from ``checkpoint``."""
    builder = store.begin(index_parameters(checkpoint, len(vectors)))
    for number, part in enumerate(np.array_split(np.arange(len(vectors)), shards)):
        entities = (int(part[0]), int(part[-1]) + 1)
        builder.add_shard(number, build_shard_index(vectors[part], IndexSpec()), part, entities)
    return builder.publish(shards)


def mined_split() -> MinedSplit:
    """Three mentions' top-3 over 10 entities (one with fewer candidates)."""
    return MinedSplit(
        mention_ids=["a", "b", "c"],
        cands=np.array([[4, 2, 9], [1, -1, -1], [7, 8, 3]]),
        scores=np.array([[3, 2, 1], [5, -np.inf, -np.inf], [1, 0.5, 0]], dtype=np.float32),
        gold_ranks=np.array([1, -1, 0]),
    )
