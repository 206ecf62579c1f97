"""Sharded search, the versioned index store and the negatives store (no Ray, no model)."""

from __future__ import annotations

import itertools
import json
import threading
from pathlib import Path

import faiss
import numpy as np
import pytest

from cluster.index_store import BuildParameters, ChecksumError, IndexStore
from cluster.negatives_store import MinedSplit, NegativesStore
from cluster.sharded_index import (
    IndexShard,
    IndexSpec,
    ShardedSearcher,
    build_shard_index,
    resolve_faiss_device,
)
from cluster.versioned_dir import confined_path


def _vectors(rows: int, dim: int = 16, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, dim)).astype(np.float32)


def _shards(vectors: np.ndarray, ids: np.ndarray, bounds: list[int]) -> list[IndexShard]:
    edges = [0, *bounds, len(vectors)]
    return [
        IndexShard(build_shard_index(vectors[a:b], IndexSpec()), ids[a:b])
        for a, b in itertools.pairwise(edges)
    ]


def test_sharded_search_equals_single_flat_index() -> None:
    vectors, queries = _vectors(500), _vectors(40, seed=1)
    searcher = ShardedSearcher(_shards(vectors, np.arange(500), [130, 260, 333]))
    flat = faiss.IndexFlatIP(16)
    flat.add(vectors)
    expected_scores, expected_ids = flat.search(queries, 10)
    ids, scores = searcher.search(queries, 10)
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-5)


def test_multi_vector_search_equals_brute_force_max_per_entity() -> None:
    entities, m, k = 120, 4, 15
    vectors = _vectors(entities * m)
    ids = np.repeat(np.arange(entities), m)
    queries = _vectors(25, seed=2)
    searcher = ShardedSearcher(_shards(vectors, ids, [200, 301]), vectors_per_entity=m)
    got_ids, got_scores = searcher.search(queries, k)
    # s(x, y) = max_t <x_1, y_t> (DESIGN.md §3, multi-m)
    brute = (queries @ vectors.T).reshape(len(queries), entities, m).max(axis=2)
    expected_ids = np.argsort(-brute, axis=1)[:, :k]
    np.testing.assert_array_equal(got_ids, expected_ids)
    np.testing.assert_allclose(got_scores, np.take_along_axis(brute, expected_ids, 1), rtol=1e-5)


def test_sum_of_max_rerank_equals_brute_force_at_full_depth() -> None:
    rng = np.random.default_rng(3)
    token_counts = rng.integers(1, 6, size=40)
    ids = np.repeat(np.arange(40), token_counts)
    vectors = _vectors(len(ids), seed=4)
    queries = _vectors(6 * 3, seed=5).reshape(6, 3, 16)
    queries[0, 2] = 0  # a padded query token
    searcher = ShardedSearcher(
        _shards(vectors, ids, [50]), vectors_per_entity=None, candidate_depth=len(ids)
    )
    got_ids, got_scores = searcher.search(queries, 5)
    for row in range(6):
        live = queries[row][np.abs(queries[row]).sum(1) > 0]
        brute = np.array([(live @ vectors[ids == e].T).max(1).sum() for e in range(40)])
        np.testing.assert_array_equal(got_ids[row], np.argsort(-brute)[:5])
        np.testing.assert_allclose(got_scores[row], np.sort(brute)[::-1][:5], rtol=1e-5)


def test_fewer_entities_than_k_pads_with_minus_one() -> None:
    searcher = ShardedSearcher(_shards(_vectors(3), np.arange(3), []))
    ids, scores = searcher.search(_vectors(2, seed=1), 5)
    assert (ids[:, 3:] == -1).all() and np.isneginf(scores[:, 3:]).all()


@pytest.mark.skipif(
    hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0,
    reason="a GPU is present: the no-GPU error cannot be provoked",
)
def test_gpu_request_without_faiss_gpu_fails_clearly() -> None:
    with pytest.raises(RuntimeError, match="GPU index shards requested"):
        resolve_faiss_device("gpu")
    assert resolve_faiss_device("auto").kind == "cpu"


def _parameters(checkpoint: int = 1, num_entities: int = 60) -> BuildParameters:
    return BuildParameters(
        checkpoint=checkpoint,
        checkpoint_path=f"checkpoints/step-{checkpoint}",
        scorer={"name": "dual"},
        dim=16,
        vectors_per_entity=1,
        num_entities=num_entities,
    )


def _publish(store: IndexStore, checkpoint: int, vectors: np.ndarray, shards: int = 3):
    builder = store.begin(_parameters(checkpoint, len(vectors)))
    for number, part in enumerate(np.array_split(np.arange(len(vectors)), shards)):
        builder.add_shard(number, build_shard_index(vectors[part], IndexSpec()), part)
    return builder.publish(shards)


def test_store_publish_search_and_retention(tmp_path: Path) -> None:
    store = IndexStore(tmp_path / "index", keep=2, device="cpu")
    assert store.current() is None
    vectors = _vectors(60)
    for checkpoint in (1, 2, 3):
        published = _publish(store, checkpoint, vectors)
    assert published.version == 3 and store.versions() == [2, 3]
    current = store.current()
    assert current.version == 3 and current.checkpoint == 3
    ids, _ = current.search(vectors[:5], 1)
    np.testing.assert_array_equal(ids[:, 0], np.arange(5))
    manifest = json.loads((tmp_path / "index/v3/manifest.json").read_text())
    assert {"version", "checkpoint", "scorer", "dim", "vectors_per_entity", "num_entities"} <= set(
        manifest
    )
    assert [shard["count"] for shard in manifest["shards"]] == [20, 20, 20]


def test_corrupted_shard_is_detected_by_checksum(tmp_path: Path) -> None:
    store = IndexStore(tmp_path / "index", device="cpu")
    _publish(store, 1, _vectors(60))
    shard = tmp_path / "index/v1/shard-00001.faiss"
    payload = bytearray(shard.read_bytes())
    payload[-7] ^= 0xFF
    shard.write_bytes(bytes(payload))
    with pytest.raises(ChecksumError, match=r"shard-00001\.faiss"):
        store.current()


def test_manifest_path_escaping_the_store_is_rejected(tmp_path: Path) -> None:
    store = IndexStore(tmp_path / "index", device="cpu")
    _publish(store, 1, _vectors(60))
    (tmp_path / "secret.faiss").write_bytes(b"x")
    manifest_path = tmp_path / "index/v1/manifest.json"
    for bad in ("../../secret.faiss", str(tmp_path / "secret.faiss"), "../v1/shard-00000.faiss"):
        manifest = json.loads(manifest_path.read_text())
        manifest["shards"][0]["file"] = bad
        manifest_path.write_text(json.dumps(manifest))
        with pytest.raises(ValueError, match=r"manifest\.json"):
            store.open(1)
    (tmp_path / "index/v1/link.faiss").symlink_to(tmp_path / "secret.faiss")
    with pytest.raises(ValueError, match="outside"):
        confined_path(tmp_path / "index/v1", "link.faiss", manifest_path)


def test_unfinished_build_is_invisible_and_resumes(tmp_path: Path) -> None:
    store = IndexStore(tmp_path / "index", device="cpu")
    vectors = _vectors(60)
    builder = store.begin(_parameters(5))
    builder.add_shard(0, build_shard_index(vectors[:30], IndexSpec()), np.arange(30))
    assert store.current() is None and store.versions() == []
    resumed = store.begin(_parameters(5))
    assert resumed.version == builder.version and list(resumed.finished_shards) == [0]
    with pytest.raises(RuntimeError, match=r"shards \[1\] not finished"):
        resumed.publish(2)
    resumed.add_shard(1, build_shard_index(vectors[30:], IndexSpec()), np.arange(30, 60))
    assert resumed.publish(2).num_entities == 60
    newer = store.begin(_parameters(6))
    assert newer.version == 2


def test_reader_never_sees_a_half_written_version(tmp_path: Path) -> None:
    store = IndexStore(tmp_path / "index", keep=2, device="cpu")
    vectors = _vectors(60)
    _publish(store, 0, vectors)
    done = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    def read_in_a_loop() -> None:
        reader = IndexStore(tmp_path / "index", keep=2, device="cpu")
        while not done.is_set():
            try:
                version = reader.current()
                assert version.checkpoint == version.version - 1
                assert sum(s["count"] for s in version.manifest["shards"]) == 60
                ids, _ = version.search(vectors[:3], 1)
                np.testing.assert_array_equal(ids[:, 0], np.arange(3))
                seen.append(version.version)
            except BaseException as error:  # surfaced below
                errors.append(error)
                return

    reader_thread = threading.Thread(target=read_in_a_loop)
    reader_thread.start()
    for checkpoint in range(1, 25):
        _publish(store, checkpoint, vectors, shards=4)
    done.set()
    reader_thread.join()
    assert not errors, errors
    assert len(set(seen)) > 1 and seen == sorted(seen)


def test_negatives_publish_latest_and_lookup(tmp_path: Path) -> None:
    store = NegativesStore(tmp_path / "negatives", keep=2)
    assert store.latest() is None
    mined = MinedSplit(
        mention_ids=["a", "b", "c"],
        cands=np.array([[4, 2, 9], [1, -1, -1], [7, 8, 3]]),
        scores=np.array([[3, 2, 1], [5, -np.inf, -np.inf], [1, 0.5, 0]], dtype=np.float32),
        gold_ranks=np.array([1, -1, 0]),
    )
    store.publish(1, {"train": mined}, checkpoint_step=100, top_n=3)
    latest = store.latest()
    assert (latest.version, latest.checkpoint_step, len(latest)) == (1, 100, 3)
    cands, scores = latest.lookup(["c", "b"])
    assert cands.tolist() == [[7, 8, 3], [1, -1, -1]]
    assert scores[1, 0] == 5 and np.isneginf(scores[1, 1].item())
    assert latest.recall_at(1) == pytest.approx(1 / 3)
    with pytest.raises(KeyError, match="'zzz'"):
        latest.lookup(["zzz"])
    store.publish(2, {"train": mined}, checkpoint_step=200, top_n=3)
    assert store.latest().checkpoint_step == 200


@pytest.mark.parametrize(
    "spec",
    [IndexSpec(kind="ivfpq", nlist=16, pq_m=8, nprobe=16), IndexSpec(kind="hnsw", hnsw_m=16)],
    ids=["ivfpq", "hnsw"],
)
def test_serving_index_kinds_find_their_own_vectors(spec: IndexSpec) -> None:
    vectors = _vectors(2000)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = np.arange(2000)
    shards = [
        IndexShard(build_shard_index(vectors[part], spec), ids[part])
        for part in np.array_split(ids, 2)
    ]
    found, _ = ShardedSearcher(shards).search(vectors[:100], 5)
    assert (found[:, 0] == ids[:100]).mean() >= 0.9
