"""The demo and yardstick subset (``write_demo_subset``): held-out mentions of entities training
links to (seen) and of entities it never does (unseen), sampled apart, fixed by the data seed;
and recall reported apart for the two (``recall_report`` with the training golds)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hnce.cluster.compute.recall import recall_report
from hnce.cluster.compute.refresh.heldout import training_golds
from hnce.cluster.stores.tables import Entity, Mention, mention_split_path
from hnce.cluster.stores.tables_read import EntityCatalogue, MentionSplit
from hnce.cluster.stores.tables_write import write_dataset
from hnce.pipeline.data.demo_subset import write_demo_subset
from hnce.pipeline.metrics import format_table


def _source(root: Path) -> Path:
    """40 entities; train mentions of entities 0..19 (two each); test mentions of entities
    0..9 (seen by the source's training) and 20..39 (unseen), two each."""
    entities = [Entity(i, f"k{i}", f"title {i}", f"text {i}", "") for i in range(40)]

    def mentions(prefix: str, golds: range) -> list[Mention]:
        return [
            Mention(f"{prefix}{g}.{n}", "left", f"m{g}", "right", g, "")
            for g in golds
            for n in range(2)
        ]

    write_dataset(
        root,
        entities,
        {"train": mentions("tr", range(20)), "test": mentions("te", [*range(10), *range(20, 40)])},
    )
    return root


def _split(root: Path, split: str) -> list[Mention]:
    return MentionSplit.open(mention_split_path(root, split)).read_all()


def test_seen_mentions_have_a_training_mention_of_their_gold_and_unseen_ones_none(
    tmp_path: Path,
) -> None:
    source = _source(tmp_path / "source")
    out = tmp_path / "subset"
    counts = write_demo_subset(source, out, 0, 8, 10, "test", seed=0, seen_mentions=6)
    catalogue = EntityCatalogue.open(out)
    key = {e.entity_id: e.key for e in catalogue.get_many(range(len(catalogue)))}
    train = _split(out, "train")
    held_out = _split(out, "test")
    trained = {key[m.gold] for m in train}
    seen = [m for m in held_out if key[m.gold] in trained]
    unseen = [m for m in held_out if key[m.gold] not in trained]
    assert counts == {
        "entities": 40,
        "train_mentions": 8,
        "seen_eval_mentions": 6,
        "unseen_eval_mentions": 10,
    }
    assert (len(train), len(seen), len(unseen)) == (8, 6, 10)
    # a seen mention is another context of a trained entity: its id is not a training mention's
    assert not {m.mention_id for m in seen} & {m.mention_id for m in train}
    assert {key[m.gold] for m in seen} <= {f"k{g}" for g in range(10)}
    # every gold keeps its key across the subset's new ids
    assert all(m.mention.removeprefix("m") == key[m.gold].removeprefix("k") for m in held_out)
    # the report tells the two apart, from the training split's golds
    hits = np.array([m in seen for m in held_out])
    candidates = np.array(
        [[m.gold if hit else -1] for m, hit in zip(held_out, hits, strict=True)], dtype=np.int64
    )
    report = recall_report(
        "r", candidates, held_out, [1], len(catalogue), training_golds(out, "train")
    )
    assert report.per_exposure == {
        "seen": {"mentions": 6.0, "recall@1": 1.0},
        "unseen": {"mentions": 10.0, "recall@1": 0.0},
    }
    assert report.recall[1] == pytest.approx(6 / 16)
    assert report.seen.tolist() == hits.tolist()
    table = format_table([report]).splitlines()
    assert [row.split("|")[0].strip() for row in table[2:]] == [
        "r",
        "seen entities",
        "unseen entities",
    ]
    assert (
        "hits" not in report.to_json() and report.to_json()["per_exposure"]["seen"]["mentions"] == 6
    )


def test_the_subset_is_fixed_by_its_seed(tmp_path: Path) -> None:
    source = _source(tmp_path / "source")

    def cut(name: str, seed: int) -> list[str]:
        write_demo_subset(source, tmp_path / name, 0, 8, 10, "test", seed=seed, seen_mentions=6)
        return [m.mention_id for split in ("train", "test") for m in _split(tmp_path / name, split)]

    assert cut("a", 0) == cut("b", 0)
    assert cut("a", 0) != cut("c", 1)


def test_a_source_with_fewer_seen_mentions_gives_what_it_has(tmp_path: Path) -> None:
    source = _source(tmp_path / "source")
    counts = write_demo_subset(
        source, tmp_path / "out", 0, 100, 0, "test", seed=0, seen_mentions=500
    )
    # 10 source-seen entities, 2 test mentions each; every test mention of the 30 other
    # entities (no training mention) is unseen
    assert counts["seen_eval_mentions"] == 20 and counts["unseen_eval_mentions"] == 40
