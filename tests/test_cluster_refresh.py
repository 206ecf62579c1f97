"""End-to-end refresh on a local 2-CPU Ray instance with a tiny random BERT (slow)."""

from __future__ import annotations

import os
import random
import shutil
import string
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import ray
import torch
from conftest import tiny_bert_config, write_wordpiece_tokenizer

from cluster.checkpoints import mark_complete
from cluster.coordinator import RefreshCoordinator
from cluster.encoder_pool import EncoderPool, ShardEncoded, encode_entity_texts
from cluster.index_store import IndexStore
from cluster.negatives_store import NegativesStore
from cluster.refresh import RefreshPlan, RefreshSettings, run_refresh
from cluster.refresh_job import EXIT_LOCKED, EXIT_OK
from cluster.sharded_index import IndexSpec
from cluster.tables import (
    Entity,
    EntityCatalogue,
    Mention,
    MentionSplit,
    mention_split_path,
    write_dataset,
)
from encoders.biencoder import build_biencoder, export_biencoder, load_biencoder

pytestmark = pytest.mark.slow

NUM_ENTITIES = 48
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ray_instance():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def _tiny_export(directory: Path, scorer: str) -> Path:
    letters = list(string.ascii_lowercase)
    tokenizer = write_wordpiece_tokenizer(directory, [*letters, *[f"##{c}" for c in letters]])
    torch.manual_seed(0)
    config = tiny_bert_config(len(tokenizer))
    model = build_biencoder(config, scorer, tokenizer=tokenizer, entity_length=24)
    export_dir = directory / "export"
    export_biencoder(model, export_dir)
    return export_dir


def _dataset(root: Path) -> Path:
    rng = random.Random(0)

    def word() -> str:
        return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 7)))

    entities = [
        Entity(i, f"k{i}", word(), " ".join(word() for _ in range(rng.randint(1, 12))))
        for i in range(NUM_ENTITIES)
    ]
    golds = [rng.randrange(NUM_ENTITIES) for _ in range(30)]
    train = [Mention(f"m{n}", word(), word(), word(), g, golds=(g,)) for n, g in enumerate(golds)]
    write_dataset(root, entities, {"train": train})
    return root


def _checkpoint(run_dir: Path, step: int, export_dir: Path) -> None:
    directory = run_dir / "checkpoints" / f"step-{step}"
    shutil.copytree(export_dir, directory / "export")
    mark_complete(directory, {"step": step})


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("refresh")
    return {
        "data": _dataset(root / "data"),
        "dual": _tiny_export(root / "dual", "dual"),
        "multi": _tiny_export(root / "multi", "multi-3"),
        "root": root,
    }


def _config(run_dir: Path, data: Path, **overrides) -> RefreshPlan:
    settings = {"shard_size": 8, "batch_size": 4, "top_n": 10, "num_encoders": 1}
    settings.update(overrides)
    return RefreshPlan(run_dir, data, RefreshSettings(**settings), IndexSpec(faiss_device="cpu"))


def _clean_run(assets) -> Path:
    run_dir = assets["root"] / "clean"
    if not (run_dir / "index" / "CURRENT").exists():
        _checkpoint(run_dir, 1, assets["dual"])
        run_refresh(_config(run_dir, assets["data"]))
    return run_dir


def test_refresh_publishes_exact_index_and_negatives(ray_instance, assets) -> None:
    run_dir = _clean_run(assets)
    version = IndexStore(run_dir / "index", device="cpu").current()
    assert (version.version, version.checkpoint, version.num_entities) == (1, 1, NUM_ENTITIES)
    assert len(version.manifest["shards"]) == NUM_ENTITIES // 8
    # The index holds exactly the model's entity vectors, whatever the sharding and bucketing.
    model = load_biencoder(assets["dual"]).eval()
    catalogue = EntityCatalogue.open(assets["data"])
    vectors, rows, _ = encode_entity_texts(
        model, catalogue.titles().to_pylist(), catalogue.texts().to_pylist(), 64, bucketed=False
    )
    np.testing.assert_array_equal(rows, np.arange(NUM_ENTITIES))
    ids, _ = version.search(vectors, 1)
    np.testing.assert_array_equal(ids[:, 0], np.arange(NUM_ENTITIES))
    negatives = NegativesStore(run_dir / "negatives").latest()
    assert (negatives.version, negatives.checkpoint_step, len(negatives)) == (1, 1, 30)
    cands, cand_scores = negatives.lookup(["m0", "m1"])
    assert cands.shape == (2, 10) and bool((cand_scores[:, :-1] >= cand_scores[:, 1:]).all())
    again = run_refresh(_config(run_dir, assets["data"]))
    assert again.up_to_date and "nothing to do" in again.line()


def test_killed_encoder_mid_refresh_publishes_identical_index(ray_instance, assets) -> None:
    clean = IndexStore(_clean_run(assets) / "index", device="cpu").current()
    run_dir = assets["root"] / "killed"
    _checkpoint(run_dir, 1, assets["dual"])
    pids: list[int] = []

    def kill_after_first_shard(encoded: ShardEncoded, pool: EncoderPool) -> None:
        pids.append(encoded.encoder_pid)
        if len(pids) == 1:
            ray.kill(pool.actors[0], no_restart=False)

    summary = run_refresh(_config(run_dir, assets["data"]), on_shard=kill_after_first_shard)
    assert len(set(pids)) == 2, "the encoder actor should have been restarted once"
    killed = IndexStore(run_dir / "index", device="cpu").current()
    assert summary.index_version == killed.version == 1
    assert killed.shard_checksums == clean.shard_checksums
    assert NegativesStore(run_dir / "negatives").latest().version == 1


def test_stale_checkpoints_are_skipped(ray_instance, assets) -> None:
    run_dir = assets["root"] / "stale"
    for step in (10, 20, 30):
        _checkpoint(run_dir, step, assets["dual"])
    (run_dir / "checkpoints" / "step-40").mkdir()  # incomplete: no COMPLETE marker
    summary = run_refresh(_config(run_dir, assets["data"], shard_size=100))
    assert summary.checkpoint == 30 and summary.skipped_checkpoints == [10, 20]
    assert NegativesStore(run_dir / "negatives").latest().checkpoint_step == 30


def test_two_concurrent_cli_refreshes_one_runs_other_exits(ray_instance, assets) -> None:
    run_dir = assets["root"] / "cli"
    _checkpoint(run_dir, 5, assets["dual"])
    command = [
        sys.executable,
        "-m",
        "pipeline.cli.main",
        "refresh",
        "--set",
        f"run.dir={run_dir}",
        "--set",
        f"data.root={assets['data']}",
        "--set",
        f"cluster.address={ray_instance}",
        "--set",
        "refresh.shard_size=16",
        "--set",
        "refresh.top_n=5",
        "--set",
        "negatives.num_negatives=4",
        "--set",
        "index.faiss_device=cpu",
    ]
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    first = subprocess.Popen(
        command, cwd=REPO, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    lock = run_dir / "refresh.lock"
    deadline = time.monotonic() + 60
    while not (lock.exists() and lock.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    second = subprocess.run(
        command, cwd=REPO, env=environment, capture_output=True, text=True, timeout=120
    )
    output, _ = first.communicate(timeout=240)
    assert second.returncode == EXIT_LOCKED, second.stdout + second.stderr
    assert "another refresh" in second.stdout and "is running" in second.stdout
    assert first.returncode == EXIT_OK, output.decode()
    assert "refresh: step-5 → index v1" in output.decode()


def test_interrupted_refresh_resumes_finished_shards(ray_instance, assets) -> None:
    clean = IndexStore(_clean_run(assets) / "index", device="cpu").current()
    run_dir = assets["root"] / "resumed"
    _checkpoint(run_dir, 1, assets["dual"])
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
    resumed = IndexStore(run_dir / "index", device="cpu").current()
    assert resumed.shard_checksums == clean.shard_checksums


def test_multi_vector_refresh_mines_the_scorers_top_n(ray_instance, assets) -> None:
    run_dir = assets["root"] / "multi"
    _checkpoint(run_dir, 1, assets["multi"])
    run_refresh(_config(run_dir, assets["data"]))
    version = IndexStore(run_dir / "index", device="cpu").current()
    assert version.vectors_per_entity == 3 and version.searcher.ntotal == 3 * NUM_ENTITIES
    negatives = NegativesStore(run_dir / "negatives").latest()
    # Direct formula: s = max_t <x_1, y_t> over every entity, from the exported model.
    model = load_biencoder(assets["multi"]).eval()
    catalogue = EntityCatalogue.open(assets["data"])
    names = ["m0", "m7"]
    split = {
        m.mention_id: m
        for m in MentionSplit.open(mention_split_path(assets["data"], "train")).read_all()
    }
    chosen = [split[name] for name in names]
    with torch.inference_mode():
        scores = model(
            model.tokenize_mentions(
                [m.context_left for m in chosen],
                [m.mention for m in chosen],
                [m.context_right for m in chosen],
            ),
            model.tokenize_entities(catalogue.titles().to_pylist(), catalogue.texts().to_pylist()),
        ).numpy()
    cands, cand_scores = negatives.lookup(names)
    np.testing.assert_array_equal(cands.numpy(), np.argsort(-scores, axis=1)[:, :10])
    np.testing.assert_allclose(
        cand_scores.numpy(), -np.sort(-scores, axis=1)[:, :10], rtol=1e-4, atol=1e-4
    )


def test_coordinator_actor_follows_new_checkpoints(ray_instance, assets) -> None:
    run_dir = assets["root"] / "watched"
    _checkpoint(run_dir, 1, assets["dual"])
    coordinator = RefreshCoordinator.remote(
        _config(run_dir, assets["data"], shard_size=100, poll_seconds=0.2)
    )
    watching = coordinator.watch.remote()
    negatives = NegativesStore(run_dir / "negatives")
    deadline = time.monotonic() + 120
    while negatives.current_version() != 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    _checkpoint(run_dir, 2, assets["dual"])
    while negatives.current_version() != 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    ray.get(coordinator.stop.remote())
    assert ray.get(watching, timeout=60) == 2
    status = ray.get(coordinator.status.remote())
    assert status["error"] is None and "step-2" in status["last"]
    assert NegativesStore(run_dir / "negatives").latest().checkpoint_step == 2
