"""Every sampler of the negative family trains from a recipe on the small synthetic dataset: a
few steps of the tiny syllable BERT, one worker, on negatives version 0 as the driver prepares it.
One sampler trains end to end, DeepSpeed under Ray Train (``hnce train``'s path, which is the same
for every sampler); the others run the worker's loop in a one-rank process group of this process,
which is where a sampler differs. OHEM and ACE start from negatives version 0 (BM25's, or the
starting model's index), so they rank real candidates from the first step without waiting for a
refresh."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from training_helpers import synthetic_config

from hnce.cluster.compute.refresh.initial import prepare_initial_negatives
from hnce.cluster.stores.checkpoints import EXPORT_DIR, checkpoint_dir, newest_checkpoint
from hnce.cluster.stores.index_store import IndexStore
from hnce.cluster.stores.negatives_store import NegativesStore
from hnce.cluster.stores.run_events import read_events
from hnce.cluster.stores.tables_read import EntityCatalogue
from hnce.events import RunEvent
from hnce.pipeline.config import Config
from hnce.pipeline.preflight import check_training_inputs
from hnce.pipeline.run import refresh_plan
from hnce.pipeline.train.one_process import single_process_group
from hnce.pipeline.train.task import TrainingTask
from hnce.pipeline.train.trainer import (
    TrainingSummary,
    initial_request,
    run_training,
    summarise_run,
)
from hnce.pipeline.train.worker import WorkerRun

pytestmark = pytest.mark.slow  # DeepSpeed, and Ray for version 0 and `hnce train`
STEPS = 6
SHORT_RUN = (
    f"training.steps={STEPS}",
    f"training.checkpoint_every={STEPS}",
    "training.num_workers=1",
    "training.batch_size=8",
    "training.warmup_steps=1",
    "negatives.num_negatives=4",
    "refresh.enabled=false",
)
#: negatives version 0 mined once before training and, with no refresh, used to the end
ONLINE = ("negatives.source=index", "negatives.ohem.pool_size=8")


def short_run(run_dir: Path, dataset: Path, model_dir: Path, *overrides: str) -> Config:
    return synthetic_config(run_dir, dataset, model_dir, *SHORT_RUN, *overrides)


def train_in_this_process(config: Config) -> TrainingSummary:
    """What ``hnce train`` runs, without Ray Train: the driver's checks and negatives version 0
    (``negatives.initial``), then the worker's loop in a one-rank gloo group of this process."""
    check_training_inputs(config)
    task = TrainingTask.retriever(config)
    request = initial_request(config, task.initial_negatives(config))
    prepare_initial_negatives(refresh_plan(config), request)
    with single_process_group():
        WorkerRun.build(config, task, torch.device("cpu"), 1, lambda *_: None).train()
    return summarise_run(config.run_dir, 0.0)


def assert_trained_to_the_end(summary: TrainingSummary) -> None:
    run_dir = summary.run_dir
    assert summary.steps == STEPS
    assert [e["step"] for e in read_events(run_dir, RunEvent.STEP)] == list(range(1, STEPS + 1))
    newest = newest_checkpoint(run_dir)
    assert newest is not None and newest[0] == STEPS


def assert_trained_on_initial_negatives(run_dir: Path, initial: str) -> None:
    """Version 0 (BM25's, or the starting model's own index) was the only negatives version: the
    sentence-transformers way, and DPR's."""
    switches = read_events(run_dir, RunEvent.NEGATIVES)
    assert [(s["step"], s["version"], s["checkpoint_step"]) for s in switches] == [(0, 0, 0)]
    assert all(e["negatives_version"] == 0 for e in read_events(run_dir, RunEvent.STEP))
    assert NegativesStore(run_dir / "negatives").current_version() == 0
    index = run_dir / "index"
    assert (IndexStore(index).versions() == [0]) if initial == "model" else not index.exists()


def test_ohem_trains_end_to_end_on_bm25_initial_negatives_prepared_beside_the_workers(
    tmp_path: Path, small_dataset: Path, syllable_bert: Path, ray_session: str
) -> None:
    """``hnce train`` of OHEM from BM25 negatives version 0, prepared by the driver while Ray
    Train starts the worker, which trains on it to the end with no refresh."""
    run_dir = tmp_path / "run"
    config = short_run(
        run_dir,
        small_dataset,
        syllable_bert,
        "negatives.sampler=ohem",
        *ONLINE,
        "negatives.initial=lexical",
    )
    summary = run_training(config)
    assert_trained_to_the_end(summary)
    assert summary.refreshes == 0
    assert_trained_on_initial_negatives(run_dir, "lexical")


def test_adversarial_trains_on_initial_negatives_mined_with_the_starting_model(
    tmp_path: Path, small_dataset: Path, syllable_bert: Path, ray_session: str
) -> None:
    run_dir = tmp_path / "run"
    config = short_run(
        run_dir,
        small_dataset,
        syllable_bert,
        "negatives.sampler=adversarial",
        *ONLINE,
        "negatives.initial=model",
    )
    assert_trained_to_the_end(train_in_this_process(config))
    assert_trained_on_initial_negatives(run_dir, "model")


def test_lexical_trains_without_an_index(
    tmp_path: Path, small_dataset: Path, syllable_bert: Path
) -> None:
    run_dir = tmp_path / "run"
    config = short_run(
        run_dir, small_dataset, syllable_bert, "negatives.sampler=lexical", "negatives.source=none"
    )
    assert_trained_to_the_end(train_in_this_process(config))
    assert not (run_dir / "negatives").exists() and not (run_dir / "index").exists()


def test_momentum_queue_trains_and_states_its_memory(
    tmp_path: Path, small_dataset: Path, syllable_bert: Path
) -> None:
    run_dir = tmp_path / "run"
    config = short_run(
        run_dir,
        small_dataset,
        syllable_bert,
        "negatives.sampler=momentum-queue",
        "negatives.source=none",
        "negatives.momentum_queue.size=32",
    )
    assert_trained_to_the_end(train_in_this_process(config))
    (queue,) = read_events(run_dir, RunEvent.LOSS_COLUMNS)
    assert queue["sampler"] == "momentum-queue"
    assert queue["bytes"] == 32 * 32 * 4  # 32 vectors of the tiny BERT's d = 32


def _export_weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    export = checkpoint_dir(run_dir, step) / EXPORT_DIR
    return {
        f"{tower}/{name}": tensor
        for tower in ("mention", "entity")
        for name, tensor in load_file(export / tower / "model.safetensors").items()
    }


def test_mixed_from_the_negative_cache_trains_and_resumes_exactly(
    tmp_path: Path, small_dataset: Path, syllable_bert: Path, ray_session: str
) -> None:
    """``negatives.cache``: filled from the starting model's version 0, written by every step and
    refreshed 4 rows a step, it gives hard candidates from the first step; a worker resumed
    from the middle checkpoint (its cache rows put back, the rest filled again from version 0)
    ends with the uninterrupted run's weights exactly."""
    run_dir = tmp_path / "run"
    cached = (
        "negatives.sampler=mixed",
        "negatives.source=index",
        "negatives.initial=model",
        "negatives.cache.enabled=true",
        "negatives.cache.refresh_rows=4",
        "training.checkpoint_every=3",
    )
    config = short_run(run_dir, small_dataset, syllable_bert, *cached)
    assert_trained_to_the_end(train_in_this_process(config))
    assert_trained_on_initial_negatives(run_dir, "model")
    (fill,) = read_events(run_dir, RunEvent.NEGATIVE_CACHE)
    space = len(EntityCatalogue.open(small_dataset).domain_of())  # one training world of three
    assert (fill["step"], fill["version"], fill["checkpoint_step"]) == (0, 0, 0)
    assert 0 < fill["replaced"] < space
    steps = read_events(run_dir, RunEvent.STEP)
    hard = [e["hard_negatives"] for e in steps]
    assert all(count == 8 * 2 for count in hard)  # half of 4 negatives for 8 mentions, each step
    assert [e["fresh_hard_negatives"] for e in steps] == hard  # 6 steps: every vector < 10 old
    assert all(e["fresh_share"] == 1.0 for e in steps)

    resumed_dir = tmp_path / "resumed"
    shutil.copytree(run_dir, resumed_dir)
    shutil.rmtree(checkpoint_dir(resumed_dir, STEPS))
    resumed = short_run(resumed_dir, small_dataset, syllable_bert, *cached)
    task = TrainingTask.retriever(resumed)
    with single_process_group():
        WorkerRun.build(resumed, task, torch.device("cpu"), 1, lambda *_: None).train()
    (restored,) = [e for e in read_events(resumed_dir, RunEvent.NEGATIVE_CACHE) if "restored" in e]
    assert restored["restored"] > 0
    uninterrupted, replayed = _export_weights(run_dir, STEPS), _export_weights(resumed_dir, STEPS)
    assert uninterrupted.keys() == replayed.keys()
    assert all(torch.equal(uninterrupted[name], replayed[name]) for name in uninterrupted)
