"""Fast unit tests of the pipeline's pure parts: recall, data order, checkpoints, settings.

The DeepSpeed configuration is tested through ``deepspeed.initialize`` (test_pipeline_engine.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from store_helpers import write_checkpoint

from hnce.cluster.compute.recall import hits_at, summarise
from hnce.cluster.stores.checkpoints import (
    COMPLETE,
    EXPORT_DIR,
    CheckpointIntegrityError,
    checkpoint_dir,
    complete_checkpoints,
    newest_checkpoint,
    prune_checkpoints,
    resolve_checkpoint,
    verify_checkpoint,
)
from hnce.cluster.stores.tables import MANIFEST_FILE
from hnce.pipeline.config import ConfigError, load_config
from hnce.pipeline.metrics import format_table
from hnce.pipeline.preflight import check_dataset
from hnce.pipeline.train.data_order import MentionOrder


def test_hits_at_uses_every_gold_and_first_position() -> None:
    candidates = np.array([[5, 3, 9, 1], [2, 2, 2, 2], [7, 8, 4, 0]])
    golds = [(3,), (6,), (0, 8)]
    hits = hits_at(candidates, golds, [1, 2, 4])
    assert hits.tolist() == [[False, True, True], [False, False, False], [False, True, True]]


def test_macro_recall_averages_domains_not_mentions() -> None:
    hits = np.array([[True], [True], [True], [False]])
    report = summarise("m", hits, ["a", "a", "a", "b"], [1], num_entities=10)
    assert report.recall[1] == pytest.approx(0.75)
    assert report.macro_recall[1] == pytest.approx(0.5)
    assert report.accuracy == pytest.approx(0.75)
    assert report.per_domain["b"]["recall@1"] == 0.0
    table = format_table([report])
    assert "R@1" in table and "0.750" in table and "0.500" in table


def test_data_order_is_a_pure_function_of_step_and_rank() -> None:
    order = MentionOrder(num_mentions=50, batch_size=4, world_size=2, seed=3)
    again = MentionOrder(num_mentions=50, batch_size=4, world_size=2, seed=3)
    epoch = [np.concatenate([order.batch(s, 0), order.batch(s, 1)]) for s in range(6)]
    seen = np.concatenate(epoch)
    assert len(set(seen.tolist())) == len(seen) == 48  # no mention twice within an epoch
    for step in (0, 5, 6, 17):
        for rank in (0, 1):
            assert np.array_equal(order.batch(step, rank), again.batch(step, rank))
    assert not np.array_equal(order.batch(0, 0), order.batch(6, 0))  # a new epoch reshuffles
    with pytest.raises(ValueError, match="cannot fill"):
        MentionOrder(num_mentions=5, batch_size=4, world_size=2, seed=0)


def test_only_complete_checkpoints_count_and_pruning_keeps_the_newest(tmp_path: Path) -> None:
    for step in (10, 20, 30, 40):
        write_checkpoint(tmp_path, step, complete=step != 40)
    assert [s for s, _ in complete_checkpoints(tmp_path)] == [10, 20, 30]
    assert newest_checkpoint(tmp_path)[0] == 30
    removed = prune_checkpoints(tmp_path, keep=1)
    assert removed == [10, 20]
    assert (checkpoint_dir(tmp_path, 30) / COMPLETE).is_file()
    assert not checkpoint_dir(tmp_path, 20).exists()
    assert checkpoint_dir(tmp_path, 40).is_dir()  # newer and incomplete: still being written


def test_checkpoint_manifest_refuses_changed_missing_and_added_files(tmp_path: Path) -> None:
    directory = write_checkpoint(tmp_path, 5, deepspeed_state=True)
    manifest = verify_checkpoint(directory)
    assert sorted(manifest.files) == [
        "deepspeed/mp_rank_00_model_states.pt",
        "export/weights.bin",
        "training_state.json",
    ]
    state = directory / "deepspeed" / "mp_rank_00_model_states.pt"
    state.write_bytes(b"crafted pickle")
    with pytest.raises(CheckpointIntegrityError, match=r"mp_rank_00_model_states\.pt: sha256"):
        verify_checkpoint(directory)
    state.unlink()
    with pytest.raises(CheckpointIntegrityError, match=r"listed in .* but missing"):
        verify_checkpoint(directory)
    other = write_checkpoint(tmp_path, 6, deepspeed_state=True)
    (other / "deepspeed" / "extra.pt").write_bytes(b"planted")
    with pytest.raises(
        CheckpointIntegrityError, match=r"extra\.pt: not in the checkpoint manifest"
    ):
        verify_checkpoint(other)


def test_a_checkpoint_resolves_as_newest_its_directory_or_its_export_and_is_verified(
    tmp_path: Path,
) -> None:
    from hnce.errors import InputError

    with pytest.raises(InputError, match="no complete checkpoint"):
        resolve_checkpoint(tmp_path, "newest")
    write_checkpoint(tmp_path, 5, deepspeed_state=True)
    newest = write_checkpoint(tmp_path, 12, deepspeed_state=True)
    assert resolve_checkpoint(tmp_path, "newest") == (12, newest / EXPORT_DIR)
    older = checkpoint_dir(tmp_path, 5)
    assert resolve_checkpoint(tmp_path, str(older)) == (5, older / EXPORT_DIR)
    assert resolve_checkpoint(tmp_path, str(older / EXPORT_DIR)) == (5, older / EXPORT_DIR)
    with pytest.raises(InputError, match="not a complete checkpoint"):
        resolve_checkpoint(tmp_path, str(tmp_path / "nowhere"))
    (newest / EXPORT_DIR / "weights.bin").write_bytes(b"tampered")
    with pytest.raises(CheckpointIntegrityError):
        resolve_checkpoint(tmp_path, "newest")


def test_the_reranker_trains_with_the_training_section_but_for_its_own_keys() -> None:
    """``--set rerank.training.steps=30`` must not turn the reranker into an 8-mention run at
    learning rate 1e-4 (the retriever's defaults): ``rerank.training`` holds the reranker's own
    batch, rate, warm-up and steps; every other setting is ``training``'s."""
    defaults = load_config(None).reranker_training()
    partial = load_config(None, ["rerank.training.steps=30"]).reranker_training()
    assert (defaults.batch_size, defaults.learning_rate, defaults.warmup_steps) == (2, 2e-5, 100)
    assert (partial.steps, partial.batch_size) == (30, 2)
    assert partial.learning_rate == defaults.learning_rate != 1e-4
    shared = load_config(None, ["training.num_workers=3", "training.checkpoint_every=7"])
    assert (
        shared.reranker_training().num_workers,
        shared.reranker_training().checkpoint_every,
    ) == (3, 7)
    retriever = shared.training  # the retriever's own are untouched by the reranker's
    assert (retriever.batch_size, retriever.learning_rate, retriever.steps) == (8, 1e-4, 1000)
    with pytest.raises(ConfigError, match=r"rerank\.training\.num_workers"):
        load_config(None, ["rerank.training.num_workers=3"])


def test_a_dataset_without_its_manifest_is_refused_before_any_work(
    small_dataset: Path, tmp_path: Path
) -> None:
    """A conversion that crashed part way leaves tables but no manifest (written last): every
    command's preflight refuses it, naming ``data.root`` and the missing manifest."""
    recipe = Path(__file__).resolve().parents[1] / "configs" / "synthetic-test.yaml"
    crashed = tmp_path / "crashed"
    shutil.copytree(small_dataset, crashed)
    (crashed / MANIFEST_FILE).unlink()
    check_dataset(load_config(recipe, [f"data.root={small_dataset}"]), ["train"])
    with pytest.raises(ConfigError, match=rf"'data.root'.*no {MANIFEST_FILE}"):
        check_dataset(load_config(recipe, [f"data.root={crashed}"]), ["train"])
