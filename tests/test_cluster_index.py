"""Sharded search and the versioned index store (no Ray, no model); the negatives store's tests
are in test_cluster_negatives_store.py.

The store tests feed each a version that lies in one way (a manifest that drops or repeats a
shard, totals that disagree with the shards, ids outside their shard, ...) and expect a
`StoreError` naming the file."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import subprocess
import sys
import threading
from pathlib import Path

import faiss
import numpy as np
import pytest
import torch
from store_helpers import edit_manifest, flip_byte, index_parameters, publish_index

from hnce.cluster.compute.index_build import IndexedModel
from hnce.cluster.compute.refresh.plan import RefreshPlan
from hnce.cluster.compute.retrieval import EVAL_INDEX_DIR, evaluation_store, version_key
from hnce.cluster.stores.exact_search import ExactSearcher
from hnce.cluster.stores.faiss_device import resolve_faiss_device
from hnce.cluster.stores.faiss_index import build_shard_index
from hnce.cluster.stores.files import sha256_file
from hnce.cluster.stores.index_shard import IndexShard
from hnce.cluster.stores.index_spec import IndexSpec
from hnce.cluster.stores.index_store import IndexBuilder, IndexStore
from hnce.cluster.stores.shard_files import QUANTISER_FILE
from hnce.cluster.stores.sharded_searcher import ShardedSearcher
from hnce.cluster.stores.tables import Entity, Mention
from hnce.cluster.stores.tables_write import write_dataset
from hnce.cluster.stores.versioned_dir import (
    USED_FILE,
    ChecksumError,
    StoreError,
    VersionedStore,
    VersionMissing,
    confined_path,
)
from hnce.encoders.scorers import build_scorer
from hnce.errors import InputError
from hnce.search import merge_entity_lists


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


def test_restricted_search_equals_flat_search_over_the_allowed_entities() -> None:
    vectors, queries = _vectors(300), _vectors(12, seed=1)
    allowed = np.sort(np.random.default_rng(2).choice(300, size=40, replace=False))
    searcher = ShardedSearcher(_shards(vectors, np.arange(300), [100, 200]))
    ids, scores = searcher.search(queries, 7, allowed=allowed)
    brute = queries @ vectors[allowed].T
    expected = allowed[np.argsort(-brute, axis=1)[:, :7]]
    np.testing.assert_array_equal(ids, expected)
    np.testing.assert_allclose(scores, -np.sort(-brute, axis=1)[:, :7], rtol=1e-5)


def test_multi_vector_search_equals_brute_force_max_per_entity() -> None:
    entities, m, k = 120, 4, 15
    # An entity's m vectors lie close together, so its vectors crowd the top hits.
    vectors = np.repeat(_vectors(entities), m, axis=0) + 0.1 * _vectors(entities * m, seed=9)
    ids = np.repeat(np.arange(entities), m)
    queries = _vectors(25, seed=2)
    searcher = ShardedSearcher(_shards(vectors, ids, [200, 300]), vectors_per_entity=m)
    got_ids, got_scores = searcher.search(queries, k)
    # s(x, y) = max_t <x_1, y_t> (docs/math.md, multi-m)
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
    shards = [
        IndexShard.on_device(
            build_shard_index(vectors[a:b], IndexSpec()), ids[a:b], resolve_faiss_device("cpu")
        )
        for a, b in itertools.pairwise([0, int(np.searchsorted(ids, 17)), len(ids)])
    ]
    searcher = ShardedSearcher(shards, vectors_per_entity=None, candidate_depth=len(ids))
    got_ids, got_scores = searcher.search(queries, 5)
    for row in range(6):
        live = queries[row][np.abs(queries[row]).sum(1) > 0]
        brute = np.array([(live @ vectors[ids == e].T).max(1).sum() for e in range(40)])
        np.testing.assert_array_equal(got_ids[row], np.argsort(-brute)[:5])
        np.testing.assert_allclose(got_scores[row], np.sort(brute)[::-1][:5], rtol=1e-5)


@pytest.mark.parametrize("spec", ["poly-4", "genpoly-4-3"])
def test_exact_search_in_chunks_equals_scoring_every_entity(spec: str) -> None:
    """Exact scorers: shards of stored reduced vectors, scored 3 entities at a time and merged,
    give the scorer's own top-k over every (allowed) entity."""
    torch.manual_seed(0)
    scorer = build_scorer(spec, 16)
    entity_hidden, entity_mask = torch.randn(40, 6, 16), torch.ones(40, 6, dtype=torch.long)
    entity_mask[::7, 2:] = 0  # short entities keep fewer genpoly vectors
    mention_hidden, mention_mask = torch.randn(5, 4, 16), torch.ones(5, 4, dtype=torch.long)
    with torch.no_grad():
        vectors, owners = scorer.entity_index_vectors(entity_hidden, entity_mask)
        queries = scorer.mention_query_vectors(mention_hidden, mention_mask).numpy()
        expected = scorer.score(mention_hidden, mention_mask, entity_hidden, entity_mask).numpy()
    bounds = [int(np.searchsorted(owners.numpy(), e)) for e in (13, 29)]
    shards = [
        IndexShard.on_device(shard.index, shard.ids, resolve_faiss_device("cpu"))
        for shard in _shards(vectors.numpy(), owners.numpy(), bounds)
    ]
    searcher = ExactSearcher(shards, scorer, torch.device("cpu"), entities_per_chunk=3)
    ids, scores = searcher.search(queries, 7)
    np.testing.assert_array_equal(ids, np.argsort(-expected, axis=1)[:, :7])
    np.testing.assert_allclose(scores, -np.sort(-expected, axis=1)[:, :7], rtol=1e-5)
    allowed = np.arange(0, 40, 5)
    ids, _ = searcher.search(queries, 10, allowed=allowed)
    masked = np.full_like(expected, -np.inf)
    masked[:, allowed] = expected[:, allowed]
    np.testing.assert_array_equal(ids[:, :8], np.argsort(-masked, axis=1)[:, :8])
    assert (ids[:, 8:] == -1).all()


def test_shards_sharing_an_entity_are_refused() -> None:
    ids = np.repeat(np.arange(10), 2)
    with pytest.raises(ValueError, match="overlap"):
        ShardedSearcher(_shards(_vectors(20), ids, [9]), vectors_per_entity=2)


def test_merge_keeps_the_best_score_of_an_entity_listed_twice() -> None:
    first = (np.array([[3, 1, -1]]), np.array([[0.9, 0.5, -np.inf]], np.float32))
    second = (np.array([[2, 3, 4]]), np.array([[0.7, 0.6, 0.1]], np.float32))
    ids, scores = merge_entity_lists([first, second], 4)
    assert ids.tolist() == [[3, 2, 1, 4]]
    np.testing.assert_allclose(scores, [[0.9, 0.7, 0.5, 0.1]])


def test_fewer_entities_than_k_pads_with_minus_one() -> None:
    searcher = ShardedSearcher(_shards(_vectors(3), np.arange(3), []))
    ids, scores = searcher.search(_vectors(2, seed=1), 5)
    assert (ids[:, 3:] == -1).all() and np.isneginf(scores[:, 3:]).all()


@pytest.mark.skipif(
    hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0,
    reason="a GPU is present: the no-GPU error cannot be provoked",
)
def test_gpu_request_without_faiss_gpu_fails_clearly() -> None:
    with pytest.raises(InputError, match=r"index\.faiss_device is gpu but"):
        resolve_faiss_device("gpu")
    assert resolve_faiss_device("auto").kind == "cpu"


def test_shard_files_are_memory_mapped_not_copied(tmp_path: Path) -> None:
    """A fresh process opens and searches a 5 MB flat shard: its private memory grows by far
    less than the shard (the vectors stay in the page cache)."""
    vectors = _vectors(20_000, dim=64)
    faiss.write_index(build_shard_index(vectors, IndexSpec()), str(tmp_path / "shard.faiss"))
    probe = f"""
import numpy as np
from pathlib import Path
from hnce.cluster.stores.shard_files import read_index_file

def anonymous_kib():
    status = Path("/proc/self/status").read_text().splitlines()
    return int(next(line for line in status if line.startswith("RssAnon")).split()[1])

before = anonymous_kib()
index = read_index_file(Path({str(tmp_path / "shard.faiss")!r}), "flat")
index.search(np.ones((4, 64), np.float32), 3)
print(anonymous_kib() - before)
"""
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    grown = int(result.stdout.split()[-1])
    assert grown < vectors.nbytes // 1024 // 4, f"{grown} KiB of private memory for a mapped shard"


def test_store_publish_search_and_retention(tmp_path: Path) -> None:
    store = IndexStore(tmp_path / "index", keep=2)
    assert store.current() is None
    vectors = _vectors(60)
    for checkpoint in (1, 2, 3):
        published = publish_index(store, checkpoint, vectors)
    assert published.version == 3 and store.versions() == [2, 3]
    current = store.current()
    assert current.version == 3 and current.checkpoint == 3
    ids, _ = current.load().search(vectors[:5], 1)
    np.testing.assert_array_equal(ids[:, 0], np.arange(5))
    manifest = json.loads((tmp_path / "index/v3/manifest.json").read_text())
    assert {"version", "checkpoint", "scorer", "dim", "vectors_per_entity", "num_entities"} <= set(
        manifest
    )
    assert [shard["count"] for shard in manifest["shards"]] == [20, 20, 20]
    assert store.find(f"{2:064x}", "c" * 64, manifest["index"]).version == 2
    assert store.find(f"{1:064x}", "c" * 64, manifest["index"]) is None  # removed by retention


def test_the_evaluation_store_keeps_its_most_recently_used_versions(tmp_path: Path) -> None:
    """keep_versions 2: version 1, found (to be used) after version 2 was built, outlives 2 when
    3 is built; the refresh store keeps the newest, found or not. A use is a stamp in the
    version's directory, written atomically."""
    plan = RefreshPlan(tmp_path / "run", tmp_path / "data", index=IndexSpec(keep_versions=2))
    vectors = _vectors(60)
    for store, kept in ((evaluation_store(plan), [1, 3]), (plan.index_store, [2, 3])):
        first = publish_index(store, 1, vectors).manifest
        publish_index(store, 2, vectors)
        assert store.find(first.model, first.catalogue, first.index).version == 1
        publish_index(store, 3, vectors)
        assert store.versions() == kept, store.root
    used = sorted(path.name for path in (tmp_path / "run" / EVAL_INDEX_DIR).rglob(USED_FILE))
    assert used == [USED_FILE] * 2 and not list((tmp_path / "run" / "index").rglob(USED_FILE))


def test_datasets_sharing_a_catalogue_share_its_evaluation_versions(tmp_path: Path) -> None:
    """An evaluation of one model on a second dataset of the same entities (other mentions)
    finds the version built for the first: nothing is encoded again, nothing is pruned."""
    entities = [Entity(i, f"k{i}", f"t{i}", f"text {i}") for i in range(60)]
    mentions = [Mention(f"m{i}", "a", f"t{i}", "b", i) for i in range(6)]
    first = write_dataset(tmp_path / "aida", entities, {"test": mentions[:3]}).root
    second = write_dataset(tmp_path / "msnbc", entities, {"test": mentions[3:]}).root
    model = IndexedModel(tmp_path / "export", 4, "e" * 64, {"scorer": {"name": "dual"}})
    plans = [RefreshPlan(tmp_path / "run", data) for data in (first, second)]
    fingerprint, catalogue, index = version_key(plans[0], model)
    built = publish_index(
        evaluation_store(plans[0]),
        4,
        _vectors(60),
        model=fingerprint,
        catalogue=catalogue,
        index=index,
    )
    found = evaluation_store(plans[1]).find(*version_key(plans[1], model))
    assert found is not None and found.path == built.path


def test_a_version_is_taken_over_by_linking_its_files_not_encoding_them(tmp_path: Path) -> None:
    """An evaluation's version of the starting model becomes a run's version 0: the same shard
    files (hard links), a manifest of its own (version 0, checkpoint 0), the same search."""
    vectors = _vectors(60)
    evaluated = publish_index(IndexStore(tmp_path / "eval-index"), 1, vectors)
    store = IndexStore(tmp_path / "index")
    parameters = dataclasses.replace(index_parameters(1, 60), checkpoint=0, checkpoint_path="m")
    taken = IndexBuilder(store, 0, parameters).take_over(evaluated)
    assert store.current_version() == 0 and (taken.version, taken.checkpoint) == (0, 0)
    for ours, theirs in zip(taken.manifest.shards, evaluated.manifest.shards, strict=True):
        assert ours == theirs
        for name in (ours.file, ours.ids):
            assert (taken.path / name).stat().st_ino == (evaluated.path / name).stat().st_ino
    ids, scores = taken.load().search(vectors[:7], 5)
    expected = evaluated.load().search(vectors[:7], 5)
    np.testing.assert_array_equal(ids, expected[0])
    np.testing.assert_array_equal(scores, expected[1])


def test_a_version_of_other_parameters_is_not_taken_over(tmp_path: Path) -> None:
    evaluated = publish_index(IndexStore(tmp_path / "eval-index"), 1, _vectors(60))
    other = dataclasses.replace(index_parameters(1, 60), model="f" * 64, checkpoint=0)
    builder = IndexBuilder(IndexStore(tmp_path / "index"), 0, other)
    with pytest.raises(StoreError, match=r"eval-index/v1/manifest.json: built with other model"):
        builder.take_over(evaluated)
    assert IndexStore(tmp_path / "index").versions() == []


def test_corrupted_shard_is_detected_by_checksum(tmp_path: Path) -> None:
    store = IndexStore(tmp_path / "index")
    publish_index(store, 1, _vectors(60))
    shard = tmp_path / "index/v1/shard-00001.faiss"
    flip_byte(shard, -7)
    with pytest.raises(ChecksumError, match=r"shard-00001\.faiss"):
        store.current().load()


def test_a_re_signed_shard_that_is_not_a_faiss_index_is_named(tmp_path: Path) -> None:
    """Behind its checksum a shard's content is checked too: garbage signed into the manifest is
    an error naming the file (FAISS's own header check), and so is a valid index of another kind
    than the manifest records."""
    store = IndexStore(tmp_path / "index")
    publish_index(store, 1, _vectors(60))
    shard = tmp_path / "index/v1/shard-00001.faiss"
    manifest = tmp_path / "index/v1/manifest.json"

    def re_sign(payload: bytes) -> None:
        shard.write_bytes(payload)
        digest = hashlib.sha256(payload).hexdigest()
        edit_manifest(manifest, lambda m: m["shards"][1].update(sha256=digest))

    re_sign(b"garbage, not an index" * 10)
    with pytest.raises(StoreError, match=r"shard-00001\.faiss: not a FAISS index FAISS can read"):
        store.current().load()
    hnsw = faiss.IndexHNSWFlat(16, 8, faiss.METRIC_INNER_PRODUCT)
    hnsw.add(_vectors(60)[20:40])
    re_sign(faiss.serialize_index(hnsw).tobytes())
    with pytest.raises(StoreError, match=r"shard-00001\.faiss: a FAISS IndexHNSWFlat, but .* flat"):
        store.current().load()


def test_manifest_path_escaping_the_store_is_rejected(tmp_path: Path) -> None:
    store = IndexStore(tmp_path / "index")
    publish_index(store, 1, _vectors(60))
    (tmp_path / "secret.faiss").write_bytes(b"x")
    manifest_path = tmp_path / "index/v1/manifest.json"
    for bad in ("../../secret.faiss", str(tmp_path / "secret.faiss"), "../v1/shard-00000.faiss"):
        manifest = json.loads(manifest_path.read_text())
        manifest["shards"][0]["file"] = bad
        manifest_path.write_text(json.dumps(manifest))
        with pytest.raises(StoreError, match=r"manifest\.json"):
            store.open(1)
    (tmp_path / "index/v1/link.faiss").symlink_to(tmp_path / "secret.faiss")
    with pytest.raises(StoreError, match="outside"):
        confined_path(tmp_path / "index/v1", "link.faiss", manifest_path)


def test_manifest_that_drops_a_shard_is_refused(tmp_path: Path) -> None:
    store = IndexStore(tmp_path / "index")
    publish_index(store, 1, _vectors(60))
    edit_manifest(tmp_path / "index/v1/manifest.json", lambda m: m["shards"].pop(1))
    with pytest.raises(StoreError, match=r"manifest\.json: entities 20\.\.39 are in no shard"):
        store.open(1)


def test_manifest_that_repeats_a_shard_is_refused(tmp_path: Path) -> None:
    store = IndexStore(tmp_path / "index")
    publish_index(store, 1, _vectors(60))
    edit_manifest(
        tmp_path / "index/v1/manifest.json", lambda m: m["shards"].insert(1, m["shards"][0])
    )
    with pytest.raises(StoreError, match=r"manifest\.json: lists shard-00000\.faiss more than"):
        store.open(1)


def test_num_entities_must_match_the_shards(tmp_path: Path) -> None:
    store = IndexStore(tmp_path / "index")
    publish_index(store, 1, _vectors(60))
    edit_manifest(tmp_path / "index/v1/manifest.json", lambda m: m.update(num_entities=70))
    with pytest.raises(StoreError, match=r"cover entities 0\.\.59 but num_entities is 70"):
        store.open(1)


def test_shard_count_must_match_its_entity_range(tmp_path: Path) -> None:
    store = IndexStore(tmp_path / "index")
    publish_index(store, 1, _vectors(60))

    def shrink(manifest: dict) -> None:
        manifest["shards"][2]["entities"] = [40, 59]
        manifest["num_entities"] = 59

    edit_manifest(tmp_path / "index/v1/manifest.json", shrink)
    with pytest.raises(StoreError, match="shard 2 records 20 vectors for 19 entities"):
        store.open(1)


def _published_with_shard_ids(root: Path, shard: int, ids: np.ndarray) -> IndexStore:
    """A store under ``root`` holding version 1 of 60 entities in 3 shards, whose shard
    ``shard`` lists ``ids`` instead, with its checksum recorded: only the id check can object."""
    store = IndexStore(root / "index")
    publish_index(store, 1, _vectors(60))
    directory = root / "index" / "v1"
    path = directory / f"shard-{shard:05d}.ids.npy"
    np.save(path, ids, allow_pickle=False)
    edit_manifest(
        directory / "manifest.json",
        lambda m: m["shards"][shard].update(ids_sha256=sha256_file(path)),
    )
    return store


def test_shard_ids_outside_their_range_are_refused(tmp_path: Path) -> None:
    ids = np.arange(20, 40)
    ids[-1] = 60  # beyond the catalogue
    store = _published_with_shard_ids(tmp_path, 1, ids)
    with pytest.raises(StoreError, match=r"shard-00001\.ids\.npy: entity ids 20\.\.60 outside"):
        store.open(1).load()


def test_dual_shard_listing_an_entity_twice_is_refused(tmp_path: Path) -> None:
    ids = np.arange(20, 40)
    ids[5] = ids[4]  # entity 24 twice, entity 25 never
    store = _published_with_shard_ids(tmp_path, 1, ids)
    with pytest.raises(StoreError, match=r"each entity of 20\.\.39 exactly 1 time"):
        store.open(1).load()


def test_manifest_missing_a_key_names_the_file_and_key(tmp_path: Path) -> None:
    store = IndexStore(tmp_path / "index")
    publish_index(store, 1, _vectors(60))
    edit_manifest(tmp_path / "index/v1/manifest.json", lambda m: m.pop("vectors_per_entity"))
    with pytest.raises(
        StoreError, match=r"manifest\.json: not a valid manifest: vectors_per_entity"
    ):
        store.current()


def test_manifest_of_another_version_is_refused(tmp_path: Path) -> None:
    store = IndexStore(tmp_path / "index", keep=2)
    publish_index(store, 1, _vectors(60))
    publish_index(store, 2, _vectors(60))
    edit_manifest(tmp_path / "index/v2/manifest.json", lambda m: m.update(version=1))
    with pytest.raises(StoreError, match="records version 1 but lies in v2/"):
        store.open(2)


def test_unfinished_build_is_invisible_and_resumes(tmp_path: Path) -> None:
    store = IndexStore(tmp_path / "index")
    vectors = _vectors(60)
    builder = store.begin(index_parameters(5))
    builder.add_shard(0, build_shard_index(vectors[:30], IndexSpec()), np.arange(30), (0, 30))
    assert store.current() is None and store.versions() == []
    resumed = store.begin(index_parameters(5))
    assert resumed.version == builder.version and list(resumed.finished_shards) == [0]
    with pytest.raises(RuntimeError, match=r"shards \[1\] not finished"):
        resumed.publish(2)
    resumed.add_shard(1, build_shard_index(vectors[30:], IndexSpec()), np.arange(30, 60), (30, 60))
    assert resumed.publish(2).num_entities == 60
    newer = store.begin(index_parameters(6))
    assert newer.version == 2


def test_a_reader_follows_current_to_the_version_it_moved_to(tmp_path: Path) -> None:
    """Both stores open their live version through one helper: a version removed while being
    opened (CURRENT moved on) is followed; a missing version CURRENT still names is an error."""
    store = VersionedStore(tmp_path)
    assert store.follow_current(lambda version: version, StoreError) is None
    (tmp_path / "v1").mkdir()
    (tmp_path / "v2").mkdir()
    (tmp_path / "CURRENT").write_text("v1\n")
    opened: list[int] = []

    def open_version(version: int) -> int:
        opened.append(version)
        if version == 1:
            (tmp_path / "CURRENT").write_text("v2\n")  # retention removed v1 meanwhile
            (tmp_path / "v1").rmdir()
            raise VersionMissing("v1: missing")
        return version

    assert store.follow_current(open_version, StoreError) == 2 and opened == [1, 2]

    def missing(version: int) -> int:
        raise VersionMissing(f"v{version}: missing")

    with pytest.raises(VersionMissing, match="v2: missing"):
        store.follow_current(missing, StoreError)
    # a CURRENT naming a version that is not there (hand-edited, or its directory deleted) is
    # refused naming the file and what is published, before anything tries to open it
    (tmp_path / "CURRENT").write_text("v9\n")
    with pytest.raises(StoreError, match=r"CURRENT:1: names v9, which is not a published version"):
        store.current_version()
    with pytest.raises(StoreError, match=r"\(published: v2\)"):
        store.follow_current(open_version, StoreError)


def test_reader_never_sees_a_half_written_version(tmp_path: Path) -> None:
    store = IndexStore(tmp_path / "index", keep=2)
    vectors = _vectors(60)
    publish_index(store, 0, vectors)
    done = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    def read_in_a_loop() -> None:
        reader = IndexStore(tmp_path / "index", keep=2)
        while not done.is_set():
            try:
                version = reader.current()
                assert version.checkpoint == version.version - 1
                assert version.num_vectors == 60
                ids, _ = version.load().search(vectors[:3], 1)
                np.testing.assert_array_equal(ids[:, 0], np.arange(3))
                seen.append(version.version)
            except FileNotFoundError:
                continue  # retention removed it between open and load; CURRENT moved on
            except BaseException as error:  # surfaced below
                errors.append(error)
                return

    reader_thread = threading.Thread(target=read_in_a_loop)
    reader_thread.start()
    for checkpoint in range(1, 25):
        publish_index(store, checkpoint, vectors, shards=4)
    done.set()
    reader_thread.join()
    assert not errors, errors
    assert len(set(seen)) > 1 and seen == sorted(seen)


def _unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_ivfpq_probes_as_many_lists_as_asked() -> None:
    """Noisy queries: probing 16 of 64 lists finds each query's source far more often than
    probing 1 (a build that ignored nprobe would score the same twice)."""
    vectors = _unit(_vectors(6000))
    queries = _unit(vectors[:300] + 0.5 * _unit(_vectors(300, seed=7)))

    def found_at_5(nprobe: int) -> float:
        spec = IndexSpec(kind="ivfpq", nlist=64, pq_m=8, nprobe=nprobe)
        ids, _ = ShardedSearcher(
            [IndexShard(build_shard_index(vectors, spec), np.arange(6000))]
        ).search(queries, 5)
        return float((ids == np.arange(300)[:, None]).any(axis=1).mean())

    one, sixteen = found_at_5(1), found_at_5(16)
    assert sixteen >= 0.8 and sixteen >= one + 0.1, (one, sixteen)


@pytest.mark.parametrize(
    "spec",
    [IndexSpec(kind="ivfpq", nlist=64, pq_m=8, nprobe=8), IndexSpec(kind="hnsw")],
    ids=["ivfpq", "hnsw"],
)
def test_serving_index_kinds_find_their_own_vectors(spec: IndexSpec) -> None:
    vectors = _vectors(6000)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = np.arange(6000)
    shards = [
        IndexShard(build_shard_index(vectors[part], spec), ids[part])
        for part in np.array_split(ids, 2)
    ]
    found, _ = ShardedSearcher(shards).search(vectors[:100], 5)
    assert (found[:, 0] == ids[:100]).mean() >= 0.9


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full")
def test_a_shard_written_onto_a_full_disk_is_the_os_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FAISS writing to a file name reported a full disk as a RuntimeError's text (a traceback
    from ``hnce refresh``); written through a Python file, it is the OSError, naming the shard,
    and no temporary file stays. Written normally, the file reads back the same index."""
    from hnce.cluster.stores import files
    from hnce.cluster.stores.shard_files import write_quantiser

    index = build_shard_index(np.eye(4, 16, dtype=np.float32), IndexSpec())
    enter = files.AtomicPath.__enter__

    def on_a_full_disk(atomic: files.AtomicPath) -> Path:
        temporary = enter(atomic)
        temporary.symlink_to("/dev/full")
        return temporary

    with monkeypatch.context() as patched:
        patched.setattr(files.AtomicPath, "__enter__", on_a_full_disk)
        with pytest.raises(OSError, match="No space left on device") as refused:
            write_quantiser(tmp_path, index)
    assert refused.value.filename == str(tmp_path / QUANTISER_FILE)
    assert list(tmp_path.iterdir()) == []
    written = write_quantiser(tmp_path, index)
    assert faiss.serialize_index(faiss.read_index(str(written))).tobytes() == (
        faiss.serialize_index(index).tobytes()
    )
