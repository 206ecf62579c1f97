"""Every sampler of the negative family trains end to end from a recipe: DeepSpeed under Ray Train,
one worker, a few steps of the tiny syllable BERT on the small synthetic dataset (one Ray instance
for the module). OHEM and ACE start from BM25 negatives version 0 (``negatives.initial:
lexical``), so they rank real candidates from the first step without waiting for a refresh."""

from __future__ import annotations

from pathlib import Path

import pytest
from training_helpers import synthetic_config

from hnce.cluster.stores.checkpoints import newest_checkpoint
from hnce.cluster.stores.index_store import IndexStore
from hnce.cluster.stores.negatives_store import NegativesStore
from hnce.events import RunEvent
from hnce.pipeline.event_log import read_events
from hnce.pipeline.train.trainer import TrainingSummary, run_training

pytestmark = pytest.mark.slow
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


def train(run_dir: Path, dataset: Path, model_dir: Path, *overrides: str) -> TrainingSummary:
    config = synthetic_config(run_dir, dataset, model_dir, *SHORT_RUN, *overrides)
    summary = run_training(config)
    assert summary.steps == STEPS
    assert [e["step"] for e in read_events(run_dir, RunEvent.STEP)] == list(range(1, STEPS + 1))
    newest = newest_checkpoint(run_dir)
    assert newest is not None and newest[0] == STEPS
    return summary


@pytest.mark.parametrize(("sampler", "initial"), [("ohem", "lexical"), ("adversarial", "model")])
def test_online_samplers_train_on_negatives_mined_once_before_training(
    tmp_path: Path,
    small_dataset: Path,
    syllable_bert: Path,
    ray_session: str,
    sampler: str,
    initial: str,
) -> None:
    """Negatives version 0 (BM25, or the starting model's own index) mined before the first
    step and, with no refresh, used to the end: the sentence-transformers way, and DPR's."""
    run_dir = tmp_path / "run"
    summary = train(
        run_dir,
        small_dataset,
        syllable_bert,
        f"negatives.sampler={sampler}",
        "negatives.source=index",
        f"negatives.initial={initial}",
        "negatives.ohem.pool_size=8",
    )
    assert summary.refreshes == 0
    switches = read_events(run_dir, RunEvent.NEGATIVES)
    assert [(s["step"], s["version"], s["checkpoint_step"]) for s in switches] == [(0, 0, 0)]
    assert all(e["negatives_version"] == 0 for e in read_events(run_dir, RunEvent.STEP))
    assert NegativesStore(run_dir / "negatives").current_version() == 0
    index = run_dir / "index"
    assert (IndexStore(index).versions() == [0]) if initial == "model" else not index.exists()


def test_lexical_trains_without_an_index(
    tmp_path: Path, small_dataset: Path, syllable_bert: Path, ray_session: str
) -> None:
    run_dir = tmp_path / "run"
    train(
        run_dir,
        small_dataset,
        syllable_bert,
        "negatives.sampler=lexical",
        "negatives.source=none",
    )
    assert not (run_dir / "negatives").exists() and not (run_dir / "index").exists()


def test_momentum_queue_trains_and_states_its_memory(
    tmp_path: Path, small_dataset: Path, syllable_bert: Path, ray_session: str
) -> None:
    run_dir = tmp_path / "run"
    train(
        run_dir,
        small_dataset,
        syllable_bert,
        "negatives.sampler=momentum-queue",
        "negatives.source=none",
        "negatives.momentum_queue.size=32",
        "negatives.momentum_queue.momentum=0.9",
    )
    (queue,) = read_events(run_dir, RunEvent.LOSS_COLUMNS)
    assert queue["sampler"] == "momentum-queue"
    assert queue["bytes"] == 32 * 32 * 4  # 32 vectors of the tiny BERT's d = 32
