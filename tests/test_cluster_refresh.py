"""End-to-end refresh, mining and evaluation through the cluster, on a local Ray instance with a
tiny random BERT (slow): shard holders, faults, placement, deadlines, and the coordinator's
memory."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import faiss
import numpy as np
import pytest
import ray
import torch
from conftest import SESSION_RAY_CPUS
from store_helpers import random_word_dataset, write_checkpoint
from training_helpers import (
    assert_exact_top_k,
    exact_scores,
    poison_weight,
    write_letter_export,
)

from hnce.cluster.compute import index_build
from hnce.cluster.compute.actors import PlacementError, StopRequested, Task, TaskClock, TaskTimeout
from hnce.cluster.compute.encoder_actor import QuantiserTask, ShardEncoded, node_cores
from hnce.cluster.compute.encoder_pool import EncoderPool, EncoderPoolSettings, KeptPool
from hnce.cluster.compute.index_build import (
    IndexedModel,
    build_parameters,
    ensure_token_store,
    index_entities,
)
from hnce.cluster.compute.refresh.engine import run_refresh
from hnce.cluster.compute.refresh.plan import RefreshPlan
from hnce.cluster.compute.refresh.settings import RefreshSettings
from hnce.cluster.compute.retrieval import EVAL_INDEX_DIR, retrieve
from hnce.cluster.stores.checkpoints import checkpoint_dir
from hnce.cluster.stores.files import sha256_file
from hnce.cluster.stores.index_spec import IndexSpec
from hnce.cluster.stores.index_store import IndexStore
from hnce.cluster.stores.negatives_store import NegativesStore
from hnce.cluster.stores.shard_files import QUANTISER_FILE
from hnce.cluster.stores.tables import Mention, mention_split_path
from hnce.cluster.stores.tables_read import EntityCatalogue, MentionSplit
from hnce.encoders.biencoder import export_biencoder, load_biencoder
from hnce.pipeline.cli.main import user_error

pytestmark = pytest.mark.slow

NUM_ENTITIES = 48


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("refresh")
    return {
        "data": random_word_dataset(root / "data", NUM_ENTITIES),
        "dual": write_letter_export(root / "dual", "dual"),
        "multi": write_letter_export(root / "multi", "multi-3"),
        "som": write_letter_export(root / "som", "som"),
        "poly-16": write_letter_export(root / "poly-16", "poly-16"),
        "genpoly-4-2": write_letter_export(root / "genpoly-4-2", "genpoly-4-2"),
        "root": root,
    }


@pytest.fixture(scope="module")
def two_encoders(ray_session) -> Iterator[KeptPool]:
    """Two encoder actors kept between this module's refreshes through two encoders and two shard
    holders, reloaded with each one's model and token store, as the training run's coordinator
    keeps its pool: each such refresh spares two actor starts. A test that needs the session's
    CPUs free closes it (``no_kept_encoders``); the next refresh on it starts it again."""
    kept = KeptPool()
    yield kept
    kept.close()


@pytest.fixture
def no_kept_encoders(two_encoders: KeptPool) -> None:
    """No kept encoder actor holds any of the session's CPUs."""
    two_encoders.close()


def _config(run_dir: Path, data: Path, depth: int = 256, **overrides) -> RefreshPlan:
    settings = {"shard_size": 8, "encoder_batch_size": 4, "top_n": 10, "num_encoders": 1}
    settings.update(overrides)
    index = IndexSpec(faiss_device="cpu", candidate_depth=depth)
    return RefreshPlan(run_dir, data, RefreshSettings(**settings), index)


def _clean_run(assets) -> Path:
    run_dir = assets["root"] / "clean"
    if not (run_dir / "index" / "CURRENT").exists():
        write_checkpoint(run_dir, 1, assets["dual"])
        run_refresh(_config(run_dir, assets["data"]))
    return run_dir


def _quantiser_arrays(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """An IVF-PQ shard file's coarse centroids and product-quantiser codebooks."""
    shard = faiss.read_index(str(path))
    index = faiss.downcast_index(faiss.extract_index_ivf(shard))  # a view: `shard` outlives it
    coarse = index.quantizer.reconstruct_n(0, index.nlist)
    return coarse, faiss.vector_to_array(index.pq.centroids)


def _train_mentions(data: Path) -> list[Mention]:
    return MentionSplit.open(mention_split_path(data, "train")).read_all()


def _assert_negatives_are_exact(run_dir: Path, export_dir: Path, data: Path, k: int = 10) -> None:
    mentions = _train_mentions(data)
    scores = exact_scores(export_dir, data, mentions)
    cands, cand_scores = (
        NegativesStore(run_dir / "negatives").latest().lookup([m.mention_id for m in mentions])
    )
    assert_exact_top_k(cands.numpy(), scores)
    np.testing.assert_allclose(
        cand_scores.numpy(), -np.sort(-scores, axis=1)[:, :k], rtol=1e-4, atol=1e-4
    )


def test_refresh_publishes_exact_index_and_negatives(ray_session, assets) -> None:
    run_dir = _clean_run(assets)
    version = IndexStore(run_dir / "index").current()
    assert (version.version, version.checkpoint, version.num_entities) == (1, 1, NUM_ENTITIES)
    assert len(version.manifest.shards) == NUM_ENTITIES // 8
    # The index holds exactly the model's entity vectors, whatever the sharding and bucketing.
    model = load_biencoder(assets["dual"]).eval()
    catalogue = EntityCatalogue.open(assets["data"])
    with torch.inference_mode():
        tokens = model.tokenize_entities(
            catalogue.titles().to_pylist(), catalogue.texts().to_pylist()
        )
        vectors, _ = model.entity_index_vectors(tokens["input_ids"], tokens["attention_mask"])
    ids, scores = version.load().search(vectors.numpy(), 1)
    np.testing.assert_array_equal(ids[:, 0], np.arange(NUM_ENTITIES))
    np.testing.assert_allclose(scores[:, 0], (vectors**2).sum(1).numpy(), rtol=1e-4)
    negatives = NegativesStore(run_dir / "negatives").latest()
    assert (negatives.version, negatives.checkpoint_step, len(negatives)) == (1, 1, 30)
    _assert_negatives_are_exact(run_dir, assets["dual"], assets["data"])
    again = run_refresh(_config(run_dir, assets["data"]))
    assert again.up_to_date and "nothing to do" in again.line()


def test_mining_through_three_shard_holders_equals_exact_search(
    ray_session, assets, no_kept_encoders
) -> None:
    run_dir = assets["root"] / "holders"
    write_checkpoint(run_dir, 1, assets["dual"])
    summary = run_refresh(_config(run_dir, assets["data"], num_encoders=3))
    assert summary.num_shards == 6 and summary.num_holders == 3
    _assert_negatives_are_exact(run_dir, assets["dual"], assets["data"])


def test_killed_encoder_mid_refresh_publishes_identical_index(ray_session, assets) -> None:
    clean = IndexStore(_clean_run(assets) / "index").current()
    run_dir = assets["root"] / "killed"
    write_checkpoint(run_dir, 1, assets["dual"])
    pids: list[int] = []

    def kill_after_first_shard(encoded: ShardEncoded, pool: EncoderPool) -> None:
        pids.append(encoded.encoder_pid)
        if len(pids) == 1:
            ray.kill(pool.actors[0], no_restart=False)

    summary = run_refresh(_config(run_dir, assets["data"]), on_shard=kill_after_first_shard)
    assert len(set(pids)) == 2, "the encoder actor should have been restarted once"
    killed = IndexStore(run_dir / "index").current()
    assert summary.index_version == killed.version == 1
    assert killed.shard_checksums == clean.shard_checksums
    _assert_negatives_are_exact(run_dir, assets["dual"], assets["data"])


def _later_export(assets) -> Path:
    """The dual model with every weight moved a little: a later checkpoint's export."""
    export_dir = assets["root"] / "dual-later" / "export"
    if not export_dir.is_dir():
        model = load_biencoder(assets["dual"])
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))
        export_biencoder(model, export_dir)
    return export_dir


def _fresh_index_of_later_export(assets) -> IndexStore:
    """The later export's index, refreshed by a pool of its own (the reference)."""
    run_dir = assets["root"] / "later-fresh"
    if not (run_dir / "index" / "CURRENT").exists():
        write_checkpoint(run_dir, 2, _later_export(assets))
        run_refresh(_config(run_dir, assets["data"]))
    return IndexStore(run_dir / "index")


def test_kept_pool_reloads_the_next_checkpoint_into_the_same_actor(ray_session, assets) -> None:
    run_dir = assets["root"] / "kept"
    later = _later_export(assets)
    kept, pids = KeptPool(), []
    try:
        write_checkpoint(run_dir, 1, assets["dual"])
        first = run_refresh(
            _config(run_dir, assets["data"]),
            on_shard=lambda encoded, _: pids.append(encoded.encoder_pid),
            kept=kept,
        )
        write_checkpoint(run_dir, 2, later)
        second = run_refresh(
            _config(run_dir, assets["data"]),
            on_shard=lambda encoded, _: pids.append(encoded.encoder_pid),
            kept=kept,
        )
        assert kept.pool is not None, "a refresh that succeeded keeps its pool"
    finally:
        kept.close()
    assert "start" in first.seconds and "reload" in second.seconds
    assert "start" not in second.seconds
    assert len(pids) == 2 * NUM_ENTITIES // 8 and len(set(pids)) == 1
    # The reloaded actor indexed the later model: the index a fresh pool builds from it.
    reloaded = IndexStore(run_dir / "index").current()
    assert (reloaded.version, reloaded.checkpoint) == (2, 2)
    assert (
        reloaded.shard_checksums == _fresh_index_of_later_export(assets).current().shard_checksums
    )
    _assert_negatives_are_exact(run_dir, later, assets["data"])


def test_restarted_actor_of_a_reloaded_pool_loads_the_current_model(ray_session, assets) -> None:
    run_dir = assets["root"] / "kept-killed"
    later = _later_export(assets)
    kept, pids = KeptPool(), []

    def kill_after_first_shard(encoded: ShardEncoded, pool: EncoderPool) -> None:
        pids.append(encoded.encoder_pid)
        if len(pids) == 1:
            ray.kill(pool.actors[0], no_restart=False)

    try:
        write_checkpoint(run_dir, 1, assets["dual"])
        run_refresh(_config(run_dir, assets["data"]), kept=kept)
        write_checkpoint(run_dir, 2, later)
        run_refresh(_config(run_dir, assets["data"]), on_shard=kill_after_first_shard, kept=kept)
    finally:
        kept.close()
    assert len(set(pids)) == 2, "the encoder actor should have been restarted once"
    # Ray restarts an actor with its first arguments; the pool's pointer makes it load step 2.
    restarted = IndexStore(run_dir / "index").current()
    assert (
        restarted.shard_checksums == _fresh_index_of_later_export(assets).current().shard_checksums
    )
    _assert_negatives_are_exact(run_dir, later, assets["data"])


def test_kept_pool_is_closed_by_a_refresh_that_stops(ray_session, assets) -> None:
    run_dir = assets["root"] / "kept-stopped"
    kept = KeptPool()
    write_checkpoint(run_dir, 1, assets["dual"])
    try:
        run_refresh(_config(run_dir, assets["data"]), kept=kept)
        actors = list(kept.pool.actors)
        write_checkpoint(run_dir, 2, _later_export(assets))
        with pytest.raises(StopRequested):
            run_refresh(_config(run_dir, assets["data"]), stopping=lambda: True, kept=kept)
        assert kept.pool is None, "a refresh that stops closes the kept pool"
        # ray.kill lands asynchronously: a call sent just before it may still be answered.
        deadline = time.monotonic() + 60
        with pytest.raises(ray.exceptions.RayActorError):
            while time.monotonic() < deadline:
                ray.get(actors[0].ready.remote(), timeout=60)
                time.sleep(0.5)
    finally:
        kept.close()


def test_kept_pool_that_cannot_release_its_shards_is_closed_not_the_refresh(
    ray_session, assets
) -> None:
    run_dir = assets["root"] / "kept-unreleased"
    kept = KeptPool()
    write_checkpoint(run_dir, 1, assets["dual"])

    def cannot_release() -> None:
        raise RuntimeError("actor gone")

    try:
        with pytest.MonkeyPatch.context() as patch:
            summary = run_refresh(
                _config(run_dir, assets["data"]),
                on_shard=lambda _, pool: patch.setattr(pool, "release", cannot_release),
                kept=kept,
            )
        assert kept.pool is None, "a pool whose actors kept their shards is closed"
    finally:
        kept.close()
    assert summary.negatives_version == 1
    assert NegativesStore(run_dir / "negatives").latest().version == 1


def test_stale_checkpoints_are_skipped(ray_session, assets) -> None:
    run_dir = assets["root"] / "stale"
    for step in (10, 20, 30):
        write_checkpoint(run_dir, step, assets["dual"])
    write_checkpoint(run_dir, 40, complete=False)  # incomplete: no COMPLETE marker
    summary = run_refresh(_config(run_dir, assets["data"], shard_size=100))
    assert summary.checkpoint == 30 and summary.skipped_checkpoints == [10, 20]
    assert NegativesStore(run_dir / "negatives").latest().checkpoint_step == 30


def test_interrupted_refresh_resumes_finished_shards(ray_session, assets) -> None:
    clean = IndexStore(_clean_run(assets) / "index").current()
    run_dir = assets["root"] / "resumed"
    write_checkpoint(run_dir, 1, assets["dual"])
    indexed: list[int] = []

    def crash_after_two_shards(encoded: ShardEncoded, pool: EncoderPool) -> None:
        indexed.append(encoded.shard_no)
        if len(indexed) == 2:
            raise RuntimeError("coordinator crashed")

    with pytest.raises(RuntimeError, match="coordinator crashed"):
        run_refresh(_config(run_dir, assets["data"]), on_shard=crash_after_two_shards)
    assert IndexStore(run_dir / "index").current_version() is None  # nothing half-published
    summary = run_refresh(_config(run_dir, assets["data"]))
    assert summary.resumed_shards == 2 and summary.index_version == 1
    resumed = IndexStore(run_dir / "index").current()
    assert resumed.shard_checksums == clean.shard_checksums


def test_multi_vector_refresh_mines_the_scorers_top_n(ray_session, assets, two_encoders) -> None:
    run_dir = assets["root"] / "multi"
    write_checkpoint(run_dir, 1, assets["multi"])
    run_refresh(_config(run_dir, assets["data"], num_encoders=2), kept=two_encoders)
    version = IndexStore(run_dir / "index").current()
    assert version.vectors_per_entity == 3 and version.num_vectors == 3 * NUM_ENTITIES
    # Direct formula: s = max_t <x_1, y_t> over every entity, from the exported model.
    _assert_negatives_are_exact(run_dir, assets["multi"], assets["data"])


def test_sum_of_max_refresh_mines_the_scorers_top_n(ray_session, assets, two_encoders) -> None:
    """Sum-of-max through two shard holders: token-level candidates `index.candidate_depth` deep,
    rescored exactly within each shard, equal the scorer's own top-N (s = Σ_i max_j ⟨x_i, y_j⟩)."""
    run_dir = assets["root"] / "som"
    write_checkpoint(run_dir, 1, assets["som"])
    plan = _config(run_dir, assets["data"], depth=10_000, shard_size=16, num_encoders=2)
    run_refresh(plan, kept=two_encoders)
    version = IndexStore(run_dir / "index").current()
    assert version.vectors_per_entity is None and version.num_vectors > NUM_ENTITIES
    _assert_negatives_are_exact(run_dir, assets["som"], assets["data"])


@pytest.mark.parametrize(
    ("kind", "token_copy"),
    [("ivfpq", False), ("ivfpq", True), ("plaid", False)],
    ids=["codes", "token-copy", "plaid"],
)
def test_compressed_sum_of_max_refresh_rescores_from_the_token_codes_or_copy(
    ray_session, assets, two_encoders, kind: str, token_copy: bool
) -> None:
    """``index.kind: ivfpq`` for sum-of-max, through two encoder actors and two shard holders:
    both shards are built on the one quantiser the version trained on a sample of the whole
    catalogue (the same centroids and codebooks; none left in the published version); each
    shard keeps its tokens' standalone codes beside the IVF-PQ lists, the holders rescore
    every candidate from them, and the mined top-10 keeps at least 0.8 of the exact top-10
    (0.917 measured at candidate depth 256, which proposes every entity here: the loss is the
    codes' alone). With ``index.token_copy`` each shard keeps a float16 copy of its tokens
    instead of codes, and the mined top-10 is the scorer's own, up to float16 rounding. A
    ``plaid`` version is built and mined the same way: its shards keep the codes alone (lists
    empty, centroids placed through HNSW) and the holders search them in PLAID's stages, every
    centroid probed here, so the loss is again the codes' alone."""
    run_dir = assets["root"] / f"som-{kind}-{token_copy}"
    write_checkpoint(run_dir, 1, assets["som"])
    plan = _config(run_dir, assets["data"], shard_size=24, num_encoders=2)
    spec = IndexSpec(
        kind=kind, nlist=8, pq_m=16, nprobe=8, token_copy=token_copy, faiss_device="cpu"
    )
    run_refresh(dataclasses.replace(plan, index=spec), kept=two_encoders)
    version = IndexStore(run_dir / "index").current()
    shards = version.manifest.shards
    first, second = (_quantiser_arrays(version.path / shard.file) for shard in shards)
    for one, other in zip(first, second, strict=True):
        np.testing.assert_array_equal(one, other)
    assert not (version.path / QUANTISER_FILE).exists()
    assert [(shard.codes, shard.vectors) for shard in shards] == [
        (None, f"shard-0000{n}.vectors.npy") if token_copy else (f"shard-0000{n}.codes.npy", None)
        for n in (0, 1)
    ]
    if kind == "plaid":
        assert all(faiss.read_index(str(version.path / s.file)).ntotal == 0 for s in shards)
    mentions = _train_mentions(assets["data"])
    scores = exact_scores(assets["som"], assets["data"], mentions)
    mined, _ = (
        NegativesStore(run_dir / "negatives").latest().lookup([m.mention_id for m in mentions])
    )
    if token_copy:
        assert_exact_top_k(mined.numpy(), scores, atol=2e-3 * np.abs(scores).max())
        return
    exact = np.argsort(-scores, axis=1)[:, :10]
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(mined.numpy(), exact, strict=True)])
    assert recall >= 0.8, recall


@pytest.mark.parametrize("source", ["multi-3 encoded", "dual from a .t7"])
def test_an_ivfpq_build_trains_one_quantiser_that_every_shard_shares(
    ray_session, assets, tmp_path: Path, caplog: pytest.LogCaptureFixture, source: str
) -> None:
    """Multi-m encoded from the token store and dual read from precomputed vectors, over ivfpq
    through two encoder actors: one quantiser, trained on a sample of the whole catalogue
    before the shards (encoded half by each encoder; read by one), under every shard (the same
    centroids and codebooks), every vector indexed once, and the quantiser's file gone from the
    published version. A build that
    crashed after its first shard resumes on the quantiser it had written, not a retrained one."""
    multi = source.startswith("multi")
    export = assets["multi" if multi else "dual"]
    model = IndexedModel.from_export(export)
    num_entities = 120 if multi else 300  # 360 and 300 vectors: the 256 a codebook trains on
    encodings, token_store, catalogue = None, None, "c" * 64
    if multi:
        tokens = ensure_token_store(random_word_dataset(tmp_path / "data", num_entities), model)
        token_store, catalogue = tokens.directory, tokens.manifest["catalogue"]
    else:
        encodings = tmp_path / "encodings.t7"
        dim = model.description.output_size
        torch.save(
            torch.randn(num_entities, dim, generator=torch.Generator().manual_seed(0)), encodings
        )
    spec = IndexSpec(kind="ivfpq", nlist=4, pq_m=4, faiss_device="cpu")
    shard_size = num_entities // 3
    parameters = build_parameters(model, catalogue, num_entities, spec, shard_size, encodings)
    store = IndexStore(tmp_path / "index")
    settings = EncoderPoolSettings(num_encoders=2, batch_size=8)
    quantiser_times: list[int] = []

    def crash(encoded: ShardEncoded, pool: EncoderPool) -> None:
        raise RuntimeError("coordinator crashed")

    def look(encoded: ShardEncoded, pool: EncoderPool) -> None:
        quantiser_times.append(resumed.quantiser_path.stat().st_mtime_ns)

    caplog.set_level(logging.INFO, logger=index_build.__name__)
    with EncoderPool(export, settings, token_store) as pool:
        if multi:  # the sample split over the two encoders is the sample one encoder encodes
            task = QuantiserTask(str(tmp_path), spec, 3, num_entities)
            whole = ray.get(pool.actors[0].quantiser_sample.remote(task, 0, 1))
            parts = ray.get(
                [a.quantiser_sample.remote(task, n, 2) for n, a in enumerate(pool.actors)]
            )
            assert all(len(part) for part in parts)
            np.testing.assert_allclose(np.concatenate(parts), whole, rtol=0, atol=1e-5)
        crashing = store.begin(parameters)
        with pytest.raises(RuntimeError, match="coordinator crashed"):
            index_entities(pool, crashing, spec, shard_size, encodings, on_shard=crash)
        resumed = store.begin(parameters)
        assert resumed.directory == crashing.directory
        os.utime(resumed.quantiser_path, ns=(0, 0))  # a retrained one would be newer
        report = index_entities(pool, resumed, spec, shard_size, encodings, on_shard=look)
    assert report.resumed_shards == 1 and quantiser_times == [0, 0]
    trained = [r.getMessage() for r in caplog.records if "quantiser trained" in r.getMessage()]
    assert (
        len(trained) == 1 and ("encoded by 2 encoder actor(s)" if multi else "(read)") in trained[0]
    )
    shards = report.version.manifest.shards
    assert len(shards) == 3
    assert sum(shard.count for shard in shards) == num_entities * (3 if multi else 1)
    first, *others = (_quantiser_arrays(report.version.path / shard.file) for shard in shards)
    for other in others:
        for one, same in zip(first, other, strict=True):
            np.testing.assert_array_equal(one, same)
    assert not (report.version.path / QUANTISER_FILE).exists()


def test_compressed_multi_vector_refresh_rescores_from_its_vector_copy(
    ray_session, assets, two_encoders
) -> None:
    """A compressed multi-m index (``hnsw`` here: it needs no quantiser trained, which this small
    catalogue could not feed), through two encoder actors and two shard holders: each shard
    keeps a float16 copy of its vectors, the holders rescore every candidate from it, and the
    mined top-10 is the scorer's own, up to the copy's float16 rounding."""
    run_dir = assets["root"] / "multi-hnsw"
    write_checkpoint(run_dir, 1, assets["multi"])
    plan = _config(run_dir, assets["data"], shard_size=24, num_encoders=2)
    plan = dataclasses.replace(plan, index=IndexSpec(kind="hnsw", faiss_device="cpu"))
    run_refresh(plan, kept=two_encoders)
    version = IndexStore(run_dir / "index").current()
    assert [shard.vectors for shard in version.manifest.shards] == [
        "shard-00000.vectors.npy",
        "shard-00001.vectors.npy",
    ]
    mentions = _train_mentions(assets["data"])
    scores = exact_scores(assets["multi"], assets["data"], mentions)
    mined, _ = (
        NegativesStore(run_dir / "negatives").latest().lookup([m.mention_id for m in mentions])
    )
    assert_exact_top_k(mined.numpy(), scores, atol=2e-3 * np.abs(scores).max())


@pytest.mark.parametrize("scorer", ["poly-16", "genpoly-4-2"])
def test_exact_refresh_and_evaluation_of_entity_dependent_scorers(
    ray_session, assets, two_encoders, scorer: str
) -> None:
    """Poly and genpoly through two shard holders: the shards store each entity's reduced
    vectors, every held entity is scored exactly (in chunks) and the merged top-N equals scoring
    every entity with the model; evaluation searches the same version, per domain too."""
    run_dir = assets["root"] / scorer
    checkpoint = write_checkpoint(run_dir, 1, assets[scorer])
    plan = _config(run_dir, assets["data"], shard_size=16, num_encoders=2)
    summary = run_refresh(plan, kept=two_encoders)
    version = IndexStore(run_dir / "index").current()
    assert summary.num_holders == 2 and version.mining == "exact"
    assert version.num_vectors == NUM_ENTITIES * (1 if scorer == "poly-16" else 2)
    _assert_negatives_are_exact(run_dir, assets[scorer], assets["data"])
    mentions = _train_mentions(assets["data"])
    model = IndexedModel.from_checkpoint(checkpoint, 1)
    retrieved = retrieve(plan, model, mentions, 5, per_domain=True)
    assert not retrieved.built and retrieved.index_version.path == version.path
    exact = exact_scores(assets[scorer], assets["data"], mentions)
    odd = np.array([m.domain == "odd" for m in mentions])
    exact[:, 1::2][~odd] = -np.inf  # an even mention never sees odd entities
    exact[:, 0::2][odd] = -np.inf
    assert_exact_top_k(retrieved.cands, exact)
    np.testing.assert_allclose(
        retrieved.scores, -np.sort(-exact, axis=1)[:, :5], rtol=1e-4, atol=1e-4
    )


def test_coordinator_never_holds_the_catalogues_vectors(
    ray_session, assets, two_encoders, monkeypatch
) -> None:
    """The refresh runs with every way of loading or building a FAISS index disabled in this
    process (the actors are other processes), and its Python heap peak does not grow with a
    catalogue 20 times larger cut into as many shards (after a warm-up run). The refreshes run
    on the module's kept pool, as the training run's coordinator runs them."""

    def refuse(*args, **kwargs):
        raise AssertionError("the coordinator loaded or built a FAISS index")

    for name in ("read_index", "deserialize_index", "IndexFlatIP", "clone_index"):
        monkeypatch.setattr(faiss, name, refuse)
    # Hashing streams 4 MiB chunks, which would hide a shard of this size in the peak.
    monkeypatch.setattr(sha256_file, "__defaults__", (1 << 14,))
    peaks = []
    for number, size in enumerate((100, 100, 2000)):
        data = random_word_dataset(assets["root"] / f"data-{number}", num_entities=size)
        run_dir = assets["root"] / f"memory-{number}"
        write_checkpoint(run_dir, 1, assets["dual"])
        ensure_token_store(data, IndexedModel.from_export(assets["dual"]))
        tracemalloc.start()
        plan = _config(run_dir, data, shard_size=size // 2, num_encoders=2)
        run_refresh(plan, kept=two_encoders)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert IndexStore(run_dir / "index").current().num_vectors == size
    one_shard_of_vectors = 1000 * 32 * 4
    assert peaks[2] - peaks[1] < one_shard_of_vectors / 4, peaks


def test_more_encoders_than_the_cluster_can_place_fail_in_seconds(ray_session, assets) -> None:
    run_dir = assets["root"] / "too-many"
    write_checkpoint(run_dir, 1, assets["dual"])
    started = time.monotonic()
    with pytest.raises(PlacementError, match=r"5 encoder actor\(s\) asking \{CPU: 1\}.*CPU 4"):
        run_refresh(_config(run_dir, assets["data"], num_encoders=5))
    # Ray would wait for the placement forever; the refusal comes before the test's own timeout
    assert time.monotonic() - started < 600
    assert IndexStore(run_dir / "index").versions() == []


def _torch_threads(pool: EncoderPool) -> list[int]:
    return ray.get([a.__ray_call__.remote(lambda _: torch.get_num_threads()) for a in pool.actors])


def _wait_for_free_cpus(cpus: int, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while ray.available_resources().get("CPU", 0) < cpus:
        assert time.monotonic() < deadline, ray.available_resources()
        time.sleep(0.1)


def test_a_pool_with_no_trainer_beside_it_shares_the_free_cpus_and_a_refresh_pool_keeps_its_own(
    ray_session, assets, no_kept_encoders
) -> None:
    """Version 0, evaluation and linking (``free_cpus``) split the CPUs Ray has free among the
    actors, each on as many torch threads as its node has cores, leaving those of a trainer that
    starts beside them (``reserved_cpus``: version 0 of ``hnce train``); a refresh beside a trainer
    keeps ``refresh.encoder_cpus``, plus the threads a waiting (sync) trainer lends it, on the
    same CPU request."""
    free = SESSION_RAY_CPUS  # the session's instance, idle once the module's earlier actors
    _wait_for_free_cpus(free)  # are released (asynchronously; "CPU" is absent while none is free)
    alone = EncoderPoolSettings(num_encoders=2, free_cpus=True)
    with EncoderPool(assets["dual"], alone) as pool:
        assert pool.request == {"CPU": 2.0}
        assert _torch_threads(pool) == [min(2, node_cores())] * 2
    with EncoderPool(assets["dual"], EncoderPoolSettings(num_encoders=1)) as pool:
        assert pool.request == {"CPU": 1.0} and _torch_threads(pool) == [1]
    lent = EncoderPoolSettings(num_encoders=1, lent_threads=1)
    with EncoderPool(assets["dual"], lent) as pool:
        assert pool.request == {"CPU": 1.0} and _torch_threads(pool) == [min(2, node_cores())]
    # version 0 of `hnce train`: a trainer asking for 1 CPU starts beside it, lending 1 thread
    _wait_for_free_cpus(free)  # the pools above are released asynchronously
    beside = EncoderPoolSettings(num_encoders=1, free_cpus=True, reserved_cpus=1, lent_threads=1)
    with EncoderPool(assets["dual"], beside) as pool:
        assert pool.request == {"CPU": 3.0}
        assert _torch_threads(pool) == [min(4, node_cores())]
    plan = _config(assets["root"] / "plan", assets["data"])
    assert plan.pool_settings(alone=True).free_cpus and not plan.pool_settings().free_cpus
    plan = dataclasses.replace(plan, lent_threads=1)
    assert (
        plan.pool_settings().lent_threads == 1 and plan.pool_settings(alone=True).lent_threads == 0
    )


@ray.remote(num_cpus=0)
class _StuckEncoder:
    def index_shard(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds


def test_a_hung_task_is_reported_with_its_shard_and_actor(ray_session) -> None:
    actor = _StuckEncoder.remote()
    ray.get(actor.index_shard.remote(0.0))  # started
    clock = TaskClock(floor_seconds=20.0, what="entity shard", measured_floor_seconds=5.0)
    quick = actor.index_shard.remote(0.1)
    assert clock.get(quick, Task("shard 0", "encoder-a")) == pytest.approx(0.1)
    assert clock.timeout == 5.0  # measured: 10 x ~0.1 s is under the measured floor
    stuck = actor.index_shard.remote(120)
    with pytest.raises(TaskTimeout, match="shard 7 on actor encoder-a: no entity shard finished"):
        clock.wait_next({stuck: Task("shard 7", "encoder-a")})
    # reported while the stuck task still runs (it sleeps 120 s): the bound, not the task, ended
    # the wait, however slow the machine
    assert ray.wait([stuck], timeout=0)[1] == [stuck]
    clock.record(0.9)
    assert clock.timeout == pytest.approx(9.0)  # 10 x the slowest shard so far
    ray.kill(actor)


def test_evaluation_reuses_the_published_index_and_equals_re_encoding(ray_session, assets) -> None:
    run_dir = _clean_run(assets)
    mentions = _train_mentions(assets["data"])
    checkpoint = checkpoint_dir(run_dir, 1)
    published = retrieve(
        _config(run_dir, assets["data"]), IndexedModel.from_checkpoint(checkpoint, 1), mentions, 10
    )
    assert not published.built and published.index_version.path == run_dir / "index" / "v1"
    fresh = assets["root"] / "fresh-eval"
    re_encoded = retrieve(
        _config(fresh, assets["data"]), IndexedModel.from_export(assets["dual"]), mentions, 10
    )
    assert re_encoded.built and re_encoded.index_version.path == fresh / EVAL_INDEX_DIR / "v1"
    np.testing.assert_array_equal(re_encoded.cands, published.cands)
    np.testing.assert_array_equal(re_encoded.scores, published.scores)
    exact = exact_scores(assets["dual"], assets["data"], mentions)
    assert_exact_top_k(published.cands, exact)
    # Evaluation never writes into the refresh's store, and finds its own version again.
    assert not (fresh / "index").exists()
    again = retrieve(
        _config(fresh, assets["data"]),
        IndexedModel.from_export(assets["dual"]),
        mentions,
        5,
        per_domain=True,
    )
    assert not again.built and again.index_version.path == fresh / EVAL_INDEX_DIR / "v1"
    domains = np.array([m.domain == "odd" for m in mentions])
    exact[:, 1::2][~domains] = -np.inf  # an even mention never sees odd entities
    exact[:, 0::2][domains] = -np.inf
    assert_exact_top_k(again.cands, exact)


def test_an_input_error_of_an_encoder_actor_start_reaches_the_driver_whole(
    ray_session, assets, no_kept_encoders, tmp_path: Path
) -> None:
    """What an actor's constructor raises reaches the driver as text only (Ray's
    ActorDiedError); the encoder keeps it and raises it from its first call, so the command's
    handler finds the InputError naming the weight (exit 2, one line), and the pool that did not
    start holds no CPUs."""
    export = tmp_path / "nan-export"
    shutil.copytree(assets["dual"], export)
    weights_file, name = poison_weight(export)
    free = ray.available_resources().get("CPU", 0)
    with pytest.raises(Exception) as raised:
        EncoderPool(export, EncoderPoolSettings(num_encoders=1))
    found = user_error(raised.value)
    assert found is not None, raised.value
    assert str(found).startswith(f"{weights_file}: weight {name} is not finite")
    _wait_for_free_cpus(int(free))
