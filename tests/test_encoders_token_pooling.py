"""Token pooling at index time (Clavié et al. 2024, ``index.token_pool_factor``): each entity's
first vector kept, the others clustered by Ward's linkage and mean-pooled."""

from __future__ import annotations

import numpy as np
from exact_scores import sum_of_max

from hnce.encoders.token_pooling import pool_tokens


def test_a_pool_factor_of_one_keeps_every_vector() -> None:
    vectors = np.random.default_rng(0).standard_normal((9, 4)).astype(np.float32)
    ids = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2])
    pooled, pooled_ids = pool_tokens(vectors, ids, 1)
    assert pooled is vectors and pooled_ids is ids


def test_each_entity_keeps_its_first_vector_and_pools_the_rest_by_the_factor() -> None:
    """An entity of 1 + n vectors keeps 1 + ⌈n / f⌉: its first as it was, the others' means;
    the means, weighted by their clusters, add up to the vectors they replace."""
    rng = np.random.default_rng(1)
    lengths = [1, 2, 6, 9]
    ids = np.repeat(np.arange(len(lengths)), lengths)
    vectors = rng.standard_normal((len(ids), 8)).astype(np.float32)
    pooled, pooled_ids = pool_tokens(vectors, ids, 2)
    assert np.bincount(pooled_ids).tolist() == [1, 2, 4, 5]
    for entity, start in enumerate(np.cumsum([0, *lengths[:-1]])):
        mine = pooled[pooled_ids == entity]
        np.testing.assert_array_equal(mine[0], vectors[start])
    # the means span the pooled vectors: each is an average of some of its entity's rest
    rest = vectors[4:9]  # entity 2: rows 3..8, its first kept
    pooled_rest = pooled[pooled_ids == 2][1:]
    weights = np.linalg.lstsq(rest.T, pooled_rest.T, rcond=None)[0]  # [5 vectors, 3 means]
    np.testing.assert_allclose(weights.sum(axis=0), 1.0, atol=1e-4)


def test_repeated_tokens_pool_into_themselves_and_leave_sum_of_max_unchanged() -> None:
    """An entity whose tokens after the first come in identical pairs pools, at factor 2, into
    exactly one of each pair (Ward merges the identical ones first): the same set of keys, so
    Σ_i max_j ⟨x_i, y_j⟩ is unchanged, bit for bit."""
    rng = np.random.default_rng(2)
    distinct = rng.standard_normal((2, 5, 16)).astype(np.float32)
    first = rng.standard_normal((2, 1, 16)).astype(np.float32)
    entities = [
        np.concatenate([f, np.repeat(d, 2, axis=0)]) for f, d in zip(first, distinct, strict=True)
    ]
    vectors = np.concatenate(entities)
    ids = np.repeat([0, 1], 11)
    pooled, pooled_ids = pool_tokens(vectors, ids, 2)
    assert np.bincount(pooled_ids).tolist() == [6, 6]
    for entity in (0, 1):
        got = {tuple(row) for row in pooled[pooled_ids == entity][1:]}
        assert got == {tuple(row) for row in distinct[entity]}
    queries = rng.standard_normal((3, 4, 16)).astype(np.float32)
    np.testing.assert_array_equal(
        sum_of_max(queries, pooled, pooled_ids), sum_of_max(queries, vectors, ids)
    )
