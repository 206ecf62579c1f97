"""The negatives store (no Ray, no model): publication, look-up and retention, and a negatives
version that lies in one way (a repeated mention, a candidate outside the catalogue, metadata or
a checksum that disagree with the manifest) refused with a `StoreError` naming the file."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from store_helpers import edit_manifest, mined_split

from hnce.cluster.stores.files import sha256_file
from hnce.cluster.stores.negatives_store import MinedSplit, NegativesStore, NegativesVersion
from hnce.cluster.stores.versioned_dir import ChecksumError, StoreError


def test_negatives_publish_latest_and_lookup(tmp_path: Path) -> None:
    store = NegativesStore(tmp_path / "negatives", keep=2)
    assert store.latest() is None
    store.publish(1, {"train": mined_split()}, checkpoint_step=100, top_n=3, num_entities=10)
    latest = store.latest()
    assert (latest.version, latest.checkpoint_step, len(latest)) == (1, 100, 3)
    cands, scores = latest.lookup(["c", "b"])
    assert cands.tolist() == [[7, 8, 3], [1, -1, -1]]
    assert scores[1, 0] == 5 and np.isneginf(scores[1, 1].item())
    assert latest.recall_at(1) == pytest.approx(1 / 3)
    with pytest.raises(KeyError, match="'zzz'"):
        latest.lookup(["zzz"])
    store.publish(2, {"train": mined_split()}, checkpoint_step=200, top_n=3, num_entities=10)
    assert store.latest().checkpoint_step == 200


def test_a_stopped_negatives_publication_is_removed_by_the_next_one(tmp_path: Path) -> None:
    """A refresh killed while it wrote negatives v1 leaves `.building-v1`; the refresh that
    supersedes it publishes v2, and v1's unfinished directory goes (nothing else writes it under
    the refresh lock, nothing would finish it). Found left over by the fault-injection test."""
    store = NegativesStore(tmp_path / "negatives", keep=2)
    store.publish(1, {"train": mined_split()}, checkpoint_step=100, top_n=3, num_entities=10)
    stopped = store.root / ".building-v2"
    stopped.mkdir()
    (stopped / "train.parquet").write_bytes(b"half a file")
    store.publish(3, {"train": mined_split()}, checkpoint_step=300, top_n=3, num_entities=10)
    assert not stopped.exists()
    assert sorted(path.name for path in store.root.iterdir()) == ["CURRENT", "v1", "v3"]


def _rewrite_negatives(directory: Path, edit) -> Path:
    """Rewrite `train.parquet` with `edit(rows)` applied and its checksum recorded: only the
    row checks can object."""
    path = directory / "train.parquet"
    table = pq.read_table(path)
    rows = table.to_pylist()
    edit(rows)
    rewritten = pa.Table.from_pylist(rows, schema=table.schema)
    pq.write_table(rewritten, path)
    edit_manifest(
        directory / "manifest.json",
        lambda m: m["splits"]["train"].update(sha256=sha256_file(path), rows=len(rows)),
    )
    return path


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda rows: rows.append(dict(rows[0])), "a mention id is listed more than once"),
        (lambda rows: rows[1].update(cands=[10]), r"candidate ids 2\.\.10 outside the catalogue"),
        (lambda rows: rows[0].update(scores=[3.0, 2.0]), "row 0 has 3 candidates but 2 scores"),
        (lambda rows: rows[2].update(gold_rank=3), "a gold_rank lies outside"),
    ],
    ids=["duplicate-mention", "candidate-out-of-range", "scores-shorter", "gold-rank"],
)
def test_inconsistent_negatives_are_refused(tmp_path: Path, edit, message: str) -> None:
    store = NegativesStore(tmp_path / "negatives")
    store.publish(1, {"train": mined_split()}, checkpoint_step=100, top_n=3, num_entities=10)
    path = _rewrite_negatives(tmp_path / "negatives/v1", edit)
    with pytest.raises(StoreError, match=rf"{re.escape(str(path))}: {message}"):
        NegativesVersion(path)


def test_inconsistent_negatives_are_never_published(tmp_path: Path) -> None:
    mined = mined_split()
    repeated = MinedSplit(["a", "a", "c"], mined.cands, mined.scores, mined.gold_ranks)
    with pytest.raises(StoreError, match="a mention id is listed more than once"):
        NegativesStore(tmp_path / "negatives").publish(1, {"train": repeated}, 100, 3, 10)
    with pytest.raises(StoreError, match=r"outside the catalogue's 0\.\.8"):
        NegativesStore(tmp_path / "negatives").publish(1, {"train": mined}, 100, 3, 9)
    assert NegativesStore(tmp_path / "negatives").latest() is None


def test_negatives_file_metadata_must_match_the_manifest(tmp_path: Path) -> None:
    store = NegativesStore(tmp_path / "negatives")
    store.publish(1, {"train": mined_split()}, checkpoint_step=100, top_n=3, num_entities=10)
    path = tmp_path / "negatives/v1/train.parquet"
    table = pq.read_table(path)
    pq.write_table(table.replace_schema_metadata({}), path)
    edit_manifest(
        tmp_path / "negatives/v1/manifest.json",
        lambda m: m["splits"]["train"].update(sha256=sha256_file(path)),
    )
    with pytest.raises(StoreError, match=r"train\.parquet: metadata hnce\.version is None"):
        store.latest()


def test_negatives_checksum_version_and_manifest_are_checked(tmp_path: Path) -> None:
    store = NegativesStore(tmp_path / "negatives", keep=3)
    store.publish(1, {"train": mined_split()}, checkpoint_step=100, top_n=3, num_entities=10)
    store.publish(2, {"train": mined_split()}, checkpoint_step=200, top_n=3, num_entities=10)
    with (tmp_path / "negatives/v1/train.parquet").open("ab") as handle:
        handle.write(b"tampered")
    with pytest.raises(ChecksumError, match=r"v1/train\.parquet: sha256"):
        NegativesVersion(tmp_path / "negatives/v1/train.parquet")
    edit_manifest(tmp_path / "negatives/v2/manifest.json", lambda m: m.update(version=1))
    with pytest.raises(StoreError, match="records version 1 but lies in v2/"):
        store.latest()
    (tmp_path / "negatives/v2/manifest.json").unlink()
    with pytest.raises(StoreError, match=r"v2/manifest\.json: missing"):
        store.latest()
