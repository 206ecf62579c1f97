"""The joint reranker: normalized / unnormalized accuracy per domain and macro, and (slow) training
through the shared driver that lifts accuracy above the retriever's and resumes where it stopped.
Its negatives (the retriever's top non-positive candidates) are tested with the drawer in
test_pipeline_step.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hnce.cluster.stores.negatives_store import MinedSplit, NegativesStore
from hnce.cluster.stores.run_events import read_events
from hnce.cluster.stores.tables import MISSING_GOLD, Mention, mention_split_path
from hnce.cluster.stores.tables_read import EntityCatalogue, MentionSplit
from hnce.events import RunEvent
from hnce.pipeline.cli.main import main
from hnce.pipeline.data.synthetic import generate_synthetic_dataset
from hnce.pipeline.rerank import SplitCandidates, accuracy_report, format_reports


def mention(mention_id: str, gold: int, golds: tuple[int, ...] = (), domain: str = "") -> Mention:
    return Mention(mention_id, "left", "m", "right", gold, domain, golds or (gold,))


def test_normalized_and_unnormalized_accuracy_per_domain_and_macro() -> None:
    mentions = [
        mention("a", 1, domain="x"),  # retrieved, reranked correctly
        mention("b", 2, domain="x"),  # retrieved, reranked wrongly
        mention("c", 3, domain="x"),  # not retrieved
        mention("d", 4, domain="y"),  # retrieved at rank 1 by the retriever, reranked correctly
        mention("e", MISSING_GOLD, domain="y"),  # gold not in the catalogue: an error
    ]
    retrieved = np.array([[9, 1], [2, 8], [5, 6], [4, 7], [-1, -1]])
    reranked = np.array([[1, 9], [8, 2], [5, 6], [4, 7], [-1, -1]])
    report = accuracy_report("dev", SplitCandidates(mentions, retrieved), reranked, 2)
    x, y = report.per_domain["x"], report.per_domain["y"]
    assert (x.mentions, x.retrieved, x.reranker_correct, x.retriever_correct) == (3, 2, 1, 1)
    assert x.normalized == pytest.approx(0.5) and x.unnormalized == pytest.approx(1 / 3)
    assert (y.mentions, y.missing_gold, y.retrieved, y.reranker_correct) == (2, 1, 1, 1)
    assert y.normalized == pytest.approx(1.0) and y.unnormalized == pytest.approx(0.5)
    assert report.macro["normalized"] == pytest.approx(0.75)
    assert report.macro["unnormalized"] == pytest.approx((1 / 3 + 0.5) / 2)
    assert report.overall.unnormalized == pytest.approx(2 / 5)
    assert report.overall.normalized == pytest.approx(2 / 3)
    table = format_reports([report])
    assert "(macro)" in table and "0.7500" in table


def weak_retriever_candidates(
    root: Path, split: str, num_candidates: int, rng: np.random.Generator
) -> MinedSplit:
    """A weak retriever: the gold always in the top N among same-world entities, at rank 1
    for a quarter of the mentions only."""
    catalogue = EntityCatalogue.open(root)
    domains = np.asarray(catalogue.domain_of().to_numpy(zero_copy_only=False))
    mentions = MentionSplit.open(mention_split_path(root, split)).read_all()
    rows = []
    for item in mentions:
        pool = np.flatnonzero(domains == item.domain)
        pool = pool[pool != item.gold]
        others = list(rng.choice(pool, num_candidates - 1, replace=False))
        position = 0 if rng.random() < 0.25 else int(rng.integers(1, num_candidates))
        others.insert(position, item.gold)
        rows.append(others)
    cands = np.asarray(rows, dtype=np.int64)
    gold_ranks = np.asarray([row.index(m.gold) for row, m in zip(rows, mentions, strict=True)])
    return MinedSplit(
        [m.mention_id for m in mentions],
        cands,
        -np.arange(num_candidates, dtype=np.float32)[None].repeat(len(rows), 0),
        gold_ranks,
    )


@pytest.mark.slow
def test_reranker_beats_its_retriever_through_the_shared_driver(
    tmp_path: Path, ray_session: str
) -> None:
    """``hnce rerank`` on a negatives version: the retriever's accuracy is ~0.25, chance is 1/8;
    the joint reranker trained by the shared DeepSpeed / Ray Train driver (checkpoints and event
    log under ``<run>/rerank``) must reach a clearly higher normalized accuracy. Its resume is
    tested in-process (test_pipeline_engine.py)."""
    data = tmp_path / "data"
    generate_synthetic_dataset(data, num_worlds=3, entities_per_world=40, mentions_per_entity=3)
    rng = np.random.default_rng(0)
    mined = {split: weak_retriever_candidates(data, split, 8, rng) for split in ("train", "test")}
    NegativesStore(tmp_path / "negatives").publish(
        1, mined, checkpoint_step=0, top_n=8, num_entities=len(EntityCatalogue.open(data))
    )
    out = tmp_path / "rerank"
    settings = {
        "run.dir": tmp_path,
        "data.root": data,
        "rerank.candidates": "negatives",
        "rerank.eval_splits": "[test]",
        "rerank.num_candidates": 8,
        "model.mention_length": 24,
        "model.entity_length": 32,
        "rerank.training.steps": 30,
        "rerank.training.learning_rate": 3e-4,
        "rerank.training.warmup_steps": 4,
        "training.checkpoint_every": 10,
        "data.max_eval_mentions": 40,
    }
    overrides = [part for key, value in settings.items() for part in ("--set", f"{key}={value}")]
    assert main(["rerank", *overrides, "--no-progress"]) == 0
    report = json.loads((out / "rerank_report.json").read_text())
    (test,) = report["splits"]
    overall = test["overall"]
    assert overall["mentions"] == 40 and overall["recall"] == 1.0
    assert overall["normalized_accuracy"] > overall["retriever_normalized_accuracy"] + 0.2
    assert (out / "reranker" / "reranker.json").is_file()
    assert (out / "crossencoder_blink.bin").is_file()
    training = report["training"]
    assert (training["task"], training["steps"], training["mentions"]) == ("reranker", 30, 120)
    assert training["checkpoints"] == [10, 20, 30]
    assert [e["world_size"] for e in read_events(out, RunEvent.START)] == [1]
