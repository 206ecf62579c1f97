"""The plaid token index (``index.kind: plaid``, PLAID, Santhanam et al. 2022): tokens stored as
centroid ids plus residual codes, candidates from the query tokens' nearest centroids, pruned
centroid interaction, centroid interaction, then exact sum-of-max over the survivors' decoded
residuals (or their float16 copy). No Ray."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import faiss
import numpy as np
import pytest
from exact_scores import max_over_vectors, recall, sum_of_max
from store_helpers import index_parameters
from token_catalogues import DIM, M, multi_catalogue, token_catalogue, token_queries

from hnce.cluster.compute.entity_encoding import compress_tokens
from hnce.cluster.stores.faiss_device import resolve_faiss_device
from hnce.cluster.stores.faiss_index import train_index
from hnce.cluster.stores.index_shard import IndexShard
from hnce.cluster.stores.index_spec import IndexSpec
from hnce.cluster.stores.index_store import IndexStore
from hnce.cluster.stores.plaid import (
    CentroidPostings,
    centroid_ids,
    centroid_interaction,
    is_plaid,
    probe,
    pruned_interaction,
)
from hnce.cluster.stores.sharded_searcher import ShardedSearcher
from hnce.cluster.stores.versioned_dir import StoreError

SPEC = IndexSpec(kind="plaid", nlist=256, pq_m=16, nprobe=4)
_TRAINED: dict[tuple[int, str], faiss.Index] = {}


def trained(vectors: np.ndarray, spec: IndexSpec) -> faiss.Index:
    """The version's plaid quantiser, trained once per catalogue size and spec in this module."""
    key = (len(vectors), repr(dataclasses.replace(spec, nprobe=None, token_copy=False)))
    if key not in _TRAINED:
        _TRAINED[key] = train_index(vectors, spec)
    index = faiss.clone_index(_TRAINED[key])
    faiss.extract_index_ivf(index).nprobe = spec.probes
    return index


def plaid_shards(
    vectors: np.ndarray, ids: np.ndarray, parts: int, spec: IndexSpec = SPEC
) -> list[IndexShard]:
    """`parts` plaid shards over contiguous entity ranges, as the encoder actors build them (one
    quantiser for the version, each shard's tokens coded on a clone of it)."""
    version = trained(vectors, spec)
    shards = []
    for entities in np.array_split(np.arange(ids.max() + 1), parts):
        rows = np.flatnonzero((ids >= entities[0]) & (ids <= entities[-1]))
        built = compress_tokens(version, [(vectors[rows], ids[rows], 0)], spec)
        cpu = resolve_faiss_device("cpu")
        shards.append(IndexShard.on_device(built.index, built.ids, cpu, built.codes, built.vectors))
    return shards


def probing(shards: list[IndexShard], nprobe: int) -> list[IndexShard]:
    for shard in shards:
        faiss.extract_index_ivf(shard.index).nprobe = nprobe
    return shards


@pytest.fixture(scope="module")
def catalogue() -> tuple[np.ndarray, np.ndarray]:
    return token_catalogue(3000)


def test_a_plaid_shard_keeps_codes_alone_with_empty_lists(catalogue) -> None:
    """A plaid shard's FAISS index is its version's quantiser, HNSW-placed, lists empty; each
    token is its centroid id (the codes' first bytes, the quantiser's own assignment) and the
    residual's product code."""
    vectors, ids = catalogue
    (shard,) = plaid_shards(vectors, ids, 1)
    assert is_plaid(shard.index) and shard.index.ntotal == 0
    assert shard.codes.shape == (len(ids), 1 + SPEC.pq_m)  # 256 centroids: a one-byte id
    ivf = faiss.extract_index_ivf(shard.index)
    _, assigned = ivf.quantizer.search(vectors, 1)
    np.testing.assert_array_equal(centroid_ids(shard.codes, ivf), assigned[:, 0])
    np.testing.assert_array_equal(shard.codes, shard.index.sa_encode(vectors))  # FAISS's own


def test_postings_list_each_entity_of_a_centroid_once() -> None:
    """The inverse holds, for each centroid, exactly the entities with a token there, once."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 9, size=50)
    tokens = rng.integers(0, 12, size=lengths.sum())
    postings = CentroidPostings.build(tokens, np.append(0, np.cumsum(lengths)), 12)
    owner = np.repeat(np.arange(50), lengths)
    for centroid in range(12):
        listed = postings.entities[postings.offsets[centroid] : postings.offsets[centroid + 1]]
        np.testing.assert_array_equal(listed, np.unique(owner[tokens == centroid]))
    np.testing.assert_array_equal(postings.token_centroids, tokens)


def test_the_pruned_score_bounds_the_centroid_interaction_from_above(catalogue) -> None:
    """Stage 3 is Σ_i max_j S[i, c(y_j)] exactly, and stage 2's imputed score is never below it
    (a centroid a query token did not probe scores at most its lowest probed one), equal when
    every centroid is probed; stage 2 proposes exactly the entities with a token in a probed
    centroid."""
    vectors, ids = catalogue
    (shard,) = plaid_shards(vectors, ids, 1)
    query = token_queries(vectors, ids, 1)[0, :3]
    by_centroid = np.ascontiguousarray(shard.centroids @ query.T)
    assigned = centroid_ids(shard.codes, faiss.extract_index_ivf(shard.index))
    for nprobe, equal in ((4, False), (256, True)):
        probed, floor = probe(by_centroid.T, nprobe)
        slots, pruned = pruned_interaction(shard.postings, by_centroid, probed, floor)
        rows, starts = shard.candidate_rows(slots)
        full = centroid_interaction(shard.postings, by_centroid, rows, starts)
        reference = np.array(
            [by_centroid[assigned[ids == entity]].max(axis=0).sum() for entity in slots]
        )
        np.testing.assert_allclose(full, reference, rtol=1e-5)
        assert np.all(pruned >= full - 1e-5)
        holding = np.unique(ids[np.isin(assigned, probed)])
        np.testing.assert_array_equal(shard.entity_rows[0][slots], holding)
        if equal:
            np.testing.assert_allclose(pruned, full, rtol=1e-5)
            assert len(slots) == ids.max() + 1


@pytest.mark.parametrize("copy", [False, True], ids=["codes", "copy"])
def test_probing_everything_is_exact_sum_of_max(catalogue, copy: bool) -> None:
    """With every centroid probed and every entity surviving both interactions, the search is
    exact sum-of-max over what the survivors are scored from (decoded residuals, or the float16
    token copy): the same entities and scores as brute force, across 3 shards, a padded query
    row left out."""
    vectors, ids = catalogue
    keep = ids < 400
    vectors, ids = vectors[keep], ids[keep]
    spec = dataclasses.replace(SPEC, token_copy=copy)
    shards = probing(plaid_shards(vectors, ids, 3, spec), 256)
    scored = (
        np.concatenate([np.asarray(shard.vectors, np.float32) for shard in shards])
        if copy
        else np.concatenate([shard.storage.sa_decode(np.asarray(shard.codes)) for shard in shards])
    )
    queries = token_queries(vectors, ids, 10)
    found, scores = ShardedSearcher(shards, None, candidate_depth=4 * 400).search(queries, 10)
    brute = sum_of_max(queries, scored, ids)
    np.testing.assert_array_equal(found, np.argsort(-brute, axis=1, kind="stable")[:, :10])
    np.testing.assert_allclose(scores, np.take_along_axis(brute, found, axis=1), rtol=1e-5)


def test_multi_m_goes_through_the_same_index_and_search() -> None:
    """Multi-m's m vectors an entity are plaid tokens and its one query vector the query: with
    everything probed the result is exact max_t ⟨x, ŷ_t⟩ over the decoded vectors."""
    vectors, ids = multi_catalogue(600)
    shards = probing(plaid_shards(vectors, ids, 2), 256)
    decoded = np.concatenate([shard.storage.sa_decode(np.asarray(shard.codes)) for shard in shards])
    queries = vectors[np.random.default_rng(4).integers(0, len(vectors), size=8)]
    found, scores = ShardedSearcher(shards, M, candidate_depth=4 * 600).search(queries, 10)
    brute = max_over_vectors(queries, decoded, ids)
    np.testing.assert_array_equal(found, np.argsort(-brute, axis=1, kind="stable")[:, :10])
    np.testing.assert_allclose(scores, np.take_along_axis(brute, found, axis=1), rtol=1e-5)


def test_a_zeshel_world_restricts_the_candidates(catalogue) -> None:
    """A search restricted to `allowed` entities returns only them: the exact top-k among them
    when everything is probed."""
    vectors, ids = catalogue
    keep = ids < 400
    vectors, ids = vectors[keep], ids[keep]
    shards = probing(plaid_shards(vectors, ids, 2), 256)
    decoded = np.concatenate([shard.storage.sa_decode(np.asarray(shard.codes)) for shard in shards])
    allowed = np.arange(0, 400, 3)
    queries = token_queries(vectors, ids, 6)
    found, _ = ShardedSearcher(shards, None, candidate_depth=1600).search(
        queries, 5, allowed=allowed
    )
    brute = sum_of_max(queries, decoded, ids)[:, allowed]
    np.testing.assert_array_equal(found, allowed[np.argsort(-brute, axis=1, kind="stable")[:, :5]])


def test_the_store_keeps_a_plaid_version_and_shares_its_quantiser(
    tmp_path: Path, catalogue
) -> None:
    """A published plaid version searches as the shards it was built from; its shards carry the
    same quantiser file, held once in memory; a count its ids and codes do not have is refused
    naming the file."""
    vectors, ids = catalogue
    keep = ids < 300
    vectors, ids = vectors[keep], ids[keep]
    shards = plaid_shards(vectors, ids, 2)
    parameters = dataclasses.replace(
        index_parameters(1, 300),
        scorer={"name": "som"},
        dim=DIM,
        vectors_per_entity=None,
        index={**SPEC.to_json(), "kind": "plaid", "shard_size": 150},
    )
    store = IndexStore(tmp_path / "index")
    builder = store.begin(parameters)
    for number, shard in enumerate(shards):
        entities = (int(shard.ids[0]), int(shard.ids[-1]) + 1)
        builder.add_shard(number, shard.storage, shard.ids, entities, shard.codes)
    builder.publish(2)
    held = store.current().load(candidate_depth=64)
    assert held.shards[0].index is held.shards[1].index
    queries = token_queries(vectors, ids, 8)
    expected = ShardedSearcher(shards, None, candidate_depth=64).search(queries, 5)
    got = held.search(queries, 5)
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-6)

    manifest = tmp_path / "index/v1/manifest.json"
    count = len(shards[0].ids)
    manifest.write_text(
        manifest.read_text().replace(f'"count": {count}', f'"count": {count + 1}', 1)
    )
    with pytest.raises(
        StoreError,
        match=rf"shard-00000\.ids\.npy: {count} ids, but .*records {count + 1}$",
    ):
        store.current().load(verify=False)


def test_plaid_recalls_the_exact_top_k(catalogue) -> None:
    """Against the exact top-20 over full-precision vectors, plaid over 3 shards (512
    centroids, 8 probed a query token, 1,024 entities kept by the pruned interaction and 256
    of them decoded) keeps at least 0.85 of it (0.887 measured). Its recall falls with the
    centroids' resolution: at 256 centroids the same budgets kept 0.771 (this catalogue's
    tokens sit around 1,000 topics)."""
    vectors, ids = catalogue
    queries = token_queries(vectors, ids, 60)
    exact = np.argsort(-sum_of_max(queries, vectors, ids), axis=1)[:, :20]
    spec = dataclasses.replace(SPEC, nlist=512, nprobe=8)
    searcher = ShardedSearcher(plaid_shards(vectors, ids, 3, spec), None, candidate_depth=1024)
    found, _ = searcher.search(queries, 20)
    assert recall(found, exact) >= 0.85, recall(found, exact)
