"""Every searcher of the catalogue is a `hnce.search.Searcher`: ``search(queries, k)`` gives
(entity ids int64 [n, k], scores float32 [n, k]) best first, padded with -1 / -inf, and takes
anything else as keyword-only options. On one tiny catalogue, each in-process searcher gives the
top-k of the scorer itself (exact search): a flat index (dual, multi-m), the sum-of-max token
index rescored exactly, the exact scorer's shards, and a shard holder holding them."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest
import torch
from store_helpers import publish_index

from hnce.cluster.compute.retrieval import OpenIndex
from hnce.cluster.compute.shard_holders import HeldIndex, HoldSpec, ShardHolder
from hnce.cluster.stores.exact_search import ExactSearcher
from hnce.cluster.stores.faiss_device import resolve_faiss_device
from hnce.cluster.stores.faiss_index import build_shard_index
from hnce.cluster.stores.index_shard import IndexShard
from hnce.cluster.stores.index_spec import IndexSpec
from hnce.cluster.stores.index_store import IndexStore
from hnce.cluster.stores.sharded_searcher import ShardedSearcher
from hnce.encoders.scorers import Scorer, build_scorer
from hnce.mining.samplers.lexical import Bm25Index
from hnce.search import PAD_ID, PAD_SCORE, Searcher

DIM, ENTITIES, MENTIONS, K = 8, 30, 6, 5
SEARCHERS = [ShardedSearcher, ExactSearcher, ShardHolder, HeldIndex, OpenIndex, Bm25Index]


@pytest.mark.parametrize("searcher", SEARCHERS, ids=lambda cls: cls.__name__)
def test_every_searcher_has_the_interfaces_shape(searcher: type) -> None:
    """``search(queries, k, *, options with defaults)``: a caller holding a `Searcher` can call
    any of them with the two arguments alone."""
    parameters = list(inspect.signature(searcher.search).parameters.values())
    assert [p.name for p in parameters[:3]] == ["self", "queries", "k"]
    for option in parameters[3:]:
        assert option.kind is inspect.Parameter.KEYWORD_ONLY, (searcher, option)
        assert option.default is not inspect.Parameter.empty, (searcher, option)


def _catalogue(scorer: Scorer) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(index vectors, their entities, query vectors, the scorer's exact [M, E] scores)."""
    torch.manual_seed(0)
    entity_hidden, entity_mask = torch.randn(ENTITIES, 4, DIM), torch.ones(ENTITIES, 4).long()
    entity_mask[::3, 2:] = 0  # entities of fewer tokens
    mention_hidden, mention_mask = torch.randn(MENTIONS, 3, DIM), torch.ones(MENTIONS, 3).long()
    mention_mask[0, 2] = 0  # a padded query token
    with torch.no_grad():
        vectors, owners = scorer.entity_index_vectors(entity_hidden, entity_mask)
        queries = scorer.mention_query_vectors(mention_hidden, mention_mask)
        exact = scorer.score(mention_hidden, mention_mask, entity_hidden, entity_mask)
    return vectors.numpy(), owners.numpy(), queries.numpy(), exact.numpy()


def _shards(vectors: np.ndarray, owners: np.ndarray) -> list[IndexShard]:
    """Two flat shards split at entity 13, on the CPU."""
    split = int(np.searchsorted(owners, 13))
    return [
        IndexShard.on_device(
            build_shard_index(vectors[rows], IndexSpec()), owners[rows], resolve_faiss_device("cpu")
        )
        for rows in (slice(0, split), slice(split, None))
    ]


def _searcher(spec: str) -> tuple[Searcher[np.ndarray], np.ndarray, np.ndarray]:
    """The in-process searcher of scorer `spec` over the tiny catalogue, its queries and the
    scorer's exact scores."""
    scorer = build_scorer(spec, DIM)
    vectors, owners, queries, exact = _catalogue(scorer)
    shards = _shards(vectors, owners)
    if not scorer.indexable:
        return ExactSearcher(shards, scorer, torch.device("cpu")), queries, exact
    # sum-of-max: every token a candidate, so the exact rescoring ranks every entity
    return ShardedSearcher(shards, scorer.vectors_per_entity, len(vectors)), queries, exact


@pytest.mark.parametrize("spec", ["dual", "multi-2", "som", "poly-2"])
def test_each_searcher_gives_the_exact_top_k_of_its_scorer(spec: str) -> None:
    searcher, queries, exact = _searcher(spec)
    assert isinstance(searcher, Searcher)
    ids, scores = searcher.search(queries, K)
    assert ids.dtype == np.int64 and scores.dtype == np.float32
    assert ids.shape == scores.shape == (MENTIONS, K)
    np.testing.assert_array_equal(ids, np.argsort(-exact, axis=1, kind="stable")[:, :K])
    np.testing.assert_allclose(scores, -np.sort(-exact, axis=1)[:, :K], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec", ["dual", "som", "poly-2"])
def test_rows_with_fewer_than_k_entities_are_padded(spec: str) -> None:
    searcher, queries, _ = _searcher(spec)
    ids, scores = searcher.search(queries, ENTITIES + 3)
    assert ids.shape == (MENTIONS, ENTITIES + 3)
    assert (ids[:, ENTITIES:] == PAD_ID).all() and (scores[:, ENTITIES:] == PAD_SCORE).all()
    assert (np.sort(ids[:, :ENTITIES], axis=1) == np.arange(ENTITIES)).all()


def test_a_shard_holder_searches_the_shards_its_spec_names(tmp_path: Path) -> None:
    """A holder is searched like any searcher; ``spec`` (keyword-only) loads what it names."""
    vectors = np.random.default_rng(1).standard_normal((ENTITIES, 16)).astype(np.float32)
    version = publish_index(IndexStore(tmp_path / "index"), 0, vectors)
    holder = ShardHolder()
    with pytest.raises(RuntimeError, match="no index shards held"):
        holder.search(vectors[:4], K)
    holder.hold(HoldSpec(version, (0,), "cpu", 256))
    ids, _ = holder.search(vectors[:4], K, spec=HoldSpec(version, (0, 1, 2), "cpu", 256))
    assert isinstance(holder, Searcher)
    np.testing.assert_array_equal(ids, np.argsort(-(vectors[:4] @ vectors.T), axis=1)[:, :K])
    again, _ = holder.search(vectors[:4], K)  # what it holds, without a spec
    np.testing.assert_array_equal(again, ids)


def test_bm25_pads_to_k_like_every_searcher() -> None:
    index = Bm25Index(["paris france capital", "paris texas city", "london"], stopwords=None)
    ids, scores = index.search(["paris", "tokyo"], k=4)
    assert ids.dtype == np.int64 and scores.dtype == np.float32 and ids.shape == (2, 4)
    assert sorted(ids[0, :2].tolist()) == [0, 1] and (ids[0, 2:] == PAD_ID).all()
    assert (ids[1] == PAD_ID).all() and (scores[1] == PAD_SCORE).all()
