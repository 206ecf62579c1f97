"""The negative cache (``hnce.mining.negative_cache``): its search is the exact top-N of the rows
ever written under the scorer, fills replace only older rows, steps always win, and the rows a
checkpoint keeps rebuild the same cache over the version it was filled from; an index version
reads back per entity as it was published."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from store_helpers import index_parameters, publish_index

from hnce.cluster.stores.faiss_index import build_shard_index
from hnce.cluster.stores.index_spec import IndexSpec
from hnce.cluster.stores.index_store import IndexStore, IndexVersion
from hnce.cluster.stores.versioned_dir import StoreError
from hnce.encoders.scorers import build_scorer
from hnce.mining import negative_cache
from hnce.mining.negative_cache import NEVER_WRITTEN, NegativeCache


def _cache(rows: int = 50, per_entity: int = 1, dim: int = 8) -> NegativeCache:
    return NegativeCache(rows, per_entity, dim)


def _vectors(count: int, per_entity: int = 1, dim: int = 8, seed: int = 0) -> torch.Tensor:
    return torch.randn(count, per_entity, dim, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("spec", "per_entity"), [("dual", 1), ("multi-3", 3)])
def test_search_is_the_exact_top_n_of_the_written_rows_in_any_block_size(
    spec: str, per_entity: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    scorer = build_scorer(spec, 8)
    cache = _cache(per_entity=per_entity)
    written = torch.arange(0, 50, 2)  # the odd rows are never written: never candidates
    vectors = _vectors(len(written), per_entity)
    cache.write(written, vectors, step=3)
    mentions = torch.randn(4, 1, 8, generator=torch.Generator().manual_seed(1))
    kept = torch.ones(4, 1, dtype=torch.bool)
    full = scorer.score_reduced(mentions, kept, vectors, torch.ones(len(written), per_entity) > 0)
    expected_scores, order = full.topk(7, dim=1)
    for block in (50, 6, 1):
        monkeypatch.setattr(negative_cache, "_SEARCH_BLOCK", block)
        rows, scores = cache.top_candidates(mentions, kept, scorer.score_reduced, 7)
        assert torch.equal(rows, written[order])
        torch.testing.assert_close(scores, expected_scores)


def test_search_pads_past_the_rows_ever_written() -> None:
    scorer = build_scorer("dual", 8)
    cache = _cache()
    cache.write(torch.tensor([5, 9]), _vectors(2), step=0)
    rows, scores = cache.top_candidates(
        torch.randn(3, 1, 8), torch.ones(3, 1, dtype=torch.bool), scorer.score_reduced, 4
    )
    assert sorted(rows[0, :2].tolist()) == [5, 9]
    assert (rows[:, 2:] == -1).all() and torch.isinf(scores[:, 2:]).all()


def test_a_fill_replaces_only_rows_older_than_its_checkpoint() -> None:
    cache = _cache(rows=6)
    assert cache.empty
    cache.write(torch.tensor([0, 1]), _vectors(2, seed=1), step=4)
    cache.write(torch.tensor([2]), _vectors(1, seed=2), step=9)
    version = _vectors(6, seed=3)
    replaced = cache.fill(torch.arange(6), version, step=5)
    assert replaced == 5  # rows 0 and 1 (step 4) and the never-written 3..5; row 2 is fresher
    assert cache.written_at.tolist() == [5, 5, 9, 5, 5, 5]
    assert torch.equal(cache.vectors[[0, 1, 3, 4, 5]], version[[0, 1, 3, 4, 5]])
    assert torch.equal(cache.vectors[2], _vectors(1, seed=2)[0])
    assert cache.by_step.tolist() == [False, False, True, False, False, False]
    assert cache.fill(torch.arange(6), _vectors(6, seed=4), step=5) == 0  # the same again


def test_a_row_written_twice_in_one_write_keeps_its_last_vector_and_padding_is_skipped() -> None:
    cache = _cache(rows=4)
    vectors = _vectors(3)
    cache.write(torch.tensor([1, -1, 1]), vectors, step=2)
    assert torch.equal(cache.vectors[1], vectors[2])
    assert cache.written_at.tolist() == [NEVER_WRITTEN, 2, NEVER_WRITTEN, NEVER_WRITTEN]


def test_oldest_and_ages_follow_the_steps() -> None:
    cache = _cache(rows=5)
    cache.write(torch.tensor([3]), _vectors(1), step=1)
    cache.write(torch.tensor([0, 4]), _vectors(2), step=7)
    assert cache.oldest(3).tolist() == [1, 2, 3]
    assert cache.ages(torch.tensor([[0, 3], [1, 4]]), step=8).tolist() == [[1, 7], [-1, 1]]


def test_the_rows_a_checkpoint_keeps_rebuild_the_cache_exactly() -> None:
    base = _vectors(30, seed=5)
    cache = _cache(rows=30)
    cache.fill(torch.arange(30), base, step=2)
    for step in range(2, 8):
        rows = torch.randint(0, 30, (6,), generator=torch.Generator().manual_seed(step))
        cache.write(rows, _vectors(6, seed=10 + step), step)
    kept = cache.written_rows()
    assert kept.rows.tolist() == cache.by_step.nonzero().flatten().tolist()

    rebuilt = _cache(rows=30)
    rebuilt.restore(kept)  # a resumed worker: the kept rows first, then its first switch's fill
    rebuilt.fill(torch.arange(30), base, step=2)
    assert torch.equal(rebuilt.vectors, cache.vectors)
    assert torch.equal(rebuilt.written_at, cache.written_at)
    assert torch.equal(rebuilt.by_step, cache.by_step)

    # a newer version published meanwhile: both replace the same rows, those older than it
    newer = _vectors(30, seed=6)
    cache.fill(torch.arange(30), newer, step=6)
    resumed = _cache(rows=30)
    resumed.restore(kept)
    resumed.fill(torch.arange(30), newer, step=6)
    assert torch.equal(resumed.vectors, cache.vectors)
    assert torch.equal(resumed.written_at, cache.written_at)


def test_a_float16_cache_halves_the_vectors_memory() -> None:
    single = NegativeCache(1000, 1, 64)
    half = NegativeCache(1000, 1, 64, dtype=torch.float16)
    assert single.memory_bytes - half.memory_bytes == 1000 * 64 * 2


@pytest.mark.parametrize("per_entity", [1, 2])
def test_an_index_version_reads_back_per_entity_as_published(
    tmp_path: Path, per_entity: int
) -> None:
    vectors = np.random.default_rng(0).standard_normal((40 * per_entity, 16)).astype(np.float32)
    store = IndexStore(tmp_path / "index")
    if per_entity == 1:
        version = publish_index(store, 3, vectors)
    else:
        version = _publish_multi(store, vectors, per_entity)
    ids, read = zip(*version.entity_vectors(), strict=True)
    assert np.array_equal(np.concatenate(ids), np.arange(40))
    assert np.array_equal(np.concatenate(read), vectors.reshape(40, per_entity, 16))


def _publish_multi(store: IndexStore, vectors: np.ndarray, per_entity: int) -> IndexVersion:
    """A multi-m version: each entity's ``per_entity`` vectors in a row, two shards."""
    parameters = dataclasses.replace(
        index_parameters(3, 40), vectors_per_entity=per_entity, scorer={"name": "multi"}
    )
    builder = store.begin(parameters)
    for number, part in enumerate(np.array_split(np.arange(40), 2)):
        rows = (part[:, None] * per_entity + np.arange(per_entity)).ravel()
        ids = np.repeat(part, per_entity)
        entities = (int(part[0]), int(part[-1]) + 1)
        builder.add_shard(number, build_shard_index(vectors[rows], IndexSpec()), ids, entities)
    return builder.publish(2)


def test_a_version_of_varying_vectors_an_entity_is_refused(tmp_path: Path) -> None:
    vectors = np.zeros((10, 16), dtype=np.float32)
    version = publish_index(IndexStore(tmp_path / "index"), 1, vectors)
    version.vectors_per_entity = None  # what a sum-of-max version records
    with pytest.raises(StoreError, match="varying number of vectors"):
        next(version.entity_vectors())
