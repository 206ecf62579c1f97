"""Deletes stay home and nothing is left behind: retention never follows a link out of the run,
a staging directory left by a process that died is removed by the next build (a live one is
never touched), two conversions racing to one new output never both publish, and a store
refuses scores that are not finite."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from store_helpers import mined_split, write_checkpoint

import hnce.cluster.stores.tables_write as tables_write
from hnce.cluster.stores.checkpoints import prune_checkpoints
from hnce.cluster.stores.files import OutsideOwner, remove_owned, staging_directory
from hnce.cluster.stores.negatives_store import MinedSplit, NegativesStore
from hnce.cluster.stores.tables import DatasetExistsError, Entity
from hnce.cluster.stores.tables_write import DatasetBuilder
from hnce.cluster.stores.versioned_dir import StoreError


def test_retention_removes_a_linked_checkpoint_as_a_link_and_never_what_it_points_to(
    tmp_path: Path,
) -> None:
    run_dir, elsewhere = tmp_path / "run", tmp_path / "precious"
    write_checkpoint(elsewhere, 1)
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "step-1").symlink_to(elsewhere / "checkpoints" / "step-1")
    for step in (2, 3):
        write_checkpoint(run_dir, step)
    before = sorted(path for path in elsewhere.rglob("*"))
    assert prune_checkpoints(run_dir, keep=2) == [1]
    assert not (run_dir / "checkpoints" / "step-1").exists()
    assert sorted(path for path in elsewhere.rglob("*")) == before


def test_the_deletion_helper_refuses_a_path_outside_its_owner(tmp_path: Path) -> None:
    (tmp_path / "owner").mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    with pytest.raises(OutsideOwner):
        remove_owned(tmp_path / "owner" / ".." / "victim.txt", tmp_path / "owner")
    assert victim.read_text() == "keep"


def test_a_staging_directory_of_a_dead_process_is_removed_by_the_next_build(
    tmp_path: Path,
) -> None:
    final = tmp_path / "dataset"
    dead = subprocess.run(["true"], check=True)  # a pid that has finished
    gone = tmp_path / f".building-dataset-{os.getpid() + 400000}-0badc0de"
    child = subprocess.Popen(["sleep", "30"])
    try:
        alive = tmp_path / f".building-dataset-{child.pid}-0123abcd"
        for leftover in (gone, alive):
            (leftover / "entities").mkdir(parents=True)
        building = staging_directory(final)
        assert building.is_dir() and not gone.exists() and alive.is_dir()
    finally:
        child.kill()
    assert dead.returncode == 0


def _entities(count: int) -> list[Entity]:
    return [Entity(i, f"k{i}", f"title {i}", "text") for i in range(count)]


def test_two_conversions_racing_to_one_new_output_never_both_publish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both builders pass their early check; each then waits after its final check so that
    the other reaches its own: only one may publish, and its dataset survives whole."""
    out = tmp_path / "out"
    checked = tables_write.check_output

    def slow_check(path: Path, overwrite: bool) -> None:
        checked(path, overwrite)
        time.sleep(0.5)

    builders = [DatasetBuilder(out, "race", 1) for _ in range(2)]
    monkeypatch.setattr(tables_write, "check_output", slow_check)
    outcomes: list[str] = []

    def publish(builder: DatasetBuilder, count: int) -> None:
        with builder.entities() as writer:
            for entity in _entities(count):
                writer.write(entity)
        try:
            builder.publish({"entities": count})
            outcomes.append(f"published {count}")
        except DatasetExistsError:
            builder.abort()
            outcomes.append("refused")

    threads = [
        threading.Thread(target=publish, args=(b, n)) for b, n in zip(builders, (3, 5), strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes)[-1] == "refused" and len(outcomes) == 2
    published = int(outcomes[0 if outcomes[0] != "refused" else 1].split()[1])
    assert tables_write.EntityCatalogue.open(out).__len__() == published
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_negatives_version_with_non_finite_scores_is_refused(tmp_path: Path) -> None:
    good = mined_split()
    scores = good.scores.copy()
    scores[0, 1] = np.nan
    bad = MinedSplit(good.mention_ids, good.cands, scores, good.gold_ranks)
    with pytest.raises(StoreError, match="1 of 7 candidate scores are not finite"):
        NegativesStore(tmp_path / "negatives").publish(1, {"train": bad}, 4, 3, 10)
    assert NegativesStore(tmp_path / "negatives").current_version() is None
