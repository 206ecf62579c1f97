"""The Parquet contracts of cluster/stores/tables.py: round trips, dense ids, look-ups, and datasets
published whole with a manifest that every reader checks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import hnce.cluster.stores.tables
import hnce.cluster.stores.tables_read
from hnce.cluster.stores.files import sha256_file
from hnce.cluster.stores.tables import (
    ENTITY_SCHEMA,
    MANIFEST_FILE,
    MENTION_SCHEMA,
    DatasetError,
    DatasetExistsError,
    Entity,
    Mention,
    mention_split_path,
)
from hnce.cluster.stores.tables_read import (
    EntityCatalogue,
    MentionSplit,
    catalogue_fingerprint,
    read_summary,
    verify_dataset,
)
from hnce.cluster.stores.tables_write import DatasetBuilder, write_dataset


def _entities(count: int) -> list[Entity]:
    return [
        Entity(i, f"key-{i}", f"Title {i % 3} é", f"text {i} ✓", f"d{i % 2}") for i in range(count)
    ]


MENTIONS = [
    Mention("m0", "", "Zoë", " drinks café", 3, "w", (1, 3)),
    Mention("m1", "at the end ", "Zürich", "", 0),
]


def test_catalogue_round_trip_over_several_files_and_row_groups(tmp_path: Path) -> None:
    entities = _entities(11)
    with DatasetBuilder(tmp_path / "data", "test", 1) as dataset:
        with dataset.entities(rows_per_file=4, batch_size=3) as writer:
            for entity in entities:
                writer.write(entity)
        dataset.publish({"entities": 11})
    catalogue = EntityCatalogue.open(tmp_path / "data")
    assert len(catalogue) == 11
    assert len(catalogue.files) == 3
    assert pq.read_schema(catalogue.files[0]).remove_metadata() == ENTITY_SCHEMA
    assert [catalogue.get(i) for i in range(11)] == entities
    assert catalogue.get_many([10, 0, 5, 5]) == [
        entities[10],
        entities[0],
        entities[5],
        entities[5],
    ]
    streamed = [row for batch in catalogue.iter_batches(batch_size=2) for row in batch.to_pylist()]
    assert [Entity(**row) for row in streamed] == entities
    assert catalogue.titles().to_pylist() == [e.title for e in entities]
    assert catalogue.domains() == ["d0", "d1"]
    assert read_summary(tmp_path / "data") == {"entities": 11}


def test_catalogue_key_and_title_lookups(tmp_path: Path) -> None:
    write_dataset(tmp_path / "data", [*_entities(7), Entity(7, "0100", "100", "x")])
    catalogue = EntityCatalogue.open(tmp_path / "data")
    assert catalogue.id_for_key("key-6") == 6
    assert catalogue.ids_for_keys(["key-2", "absent", "key-0"]).tolist() == [2, -1, 0]
    # keys compare exactly as written: no numeric normalisation
    assert catalogue.ids_for_keys(["0100", "100", "١٠٠"]).tolist() == [7, -1, -1]
    assert catalogue.ids_for_title("Title 1 é") == [1, 4]
    assert catalogue.ids_for_titles(["Title 2 é", "nope", "Title 1 é"]).tolist() == [2, -1, 1]
    with pytest.raises(KeyError, match="absent"):
        catalogue.id_for_key("absent")
    with pytest.raises(IndexError):
        catalogue.get(8)


def test_lookups_are_exact_when_fingerprints_collide(tmp_path: Path, monkeypatch) -> None:
    write_dataset(tmp_path / "data", _entities(5))
    catalogue = EntityCatalogue.open(tmp_path / "data")
    monkeypatch.setattr(hnce.cluster.stores.tables_read, "hash", lambda value: 7, raising=False)
    assert hnce.cluster.stores.tables_read._fingerprints(["key-1", "key-2"]).tolist() == [7, 7]
    assert catalogue.ids_for_keys(["key-3", "nope", "key-0"]).tolist() == [3, -1, 0]
    assert catalogue.ids_for_title("Title 2 é") == [2]


def test_writer_requires_dense_ids_and_a_failure_leaves_nothing(tmp_path: Path) -> None:
    with (
        pytest.raises(ValueError, match="dense"),
        DatasetBuilder(tmp_path / "data", "test", 1) as dataset,
        dataset.entities() as writer,
    ):
        writer.write(Entity(0, "a", "A", "x"))
        writer.write(Entity(2, "b", "B", "y"))
    assert list(tmp_path.iterdir()) == []


def test_mentions_round_trip_and_golds_start_with_gold(tmp_path: Path) -> None:
    write_dataset(tmp_path / "data", _entities(4), {"dev": MENTIONS})
    path = mention_split_path(tmp_path / "data", "dev")
    assert pq.read_schema(path).remove_metadata() == MENTION_SCHEMA
    split = MentionSplit.open(path)
    assert len(split) == 2
    read = split.read_all()
    assert read == MENTIONS
    assert read[0].golds == (3, 1)
    assert read[1].golds == (0,)
    assert [len(batch) for batch in split.iter_batches(batch_size=1)] == [1, 1]
    assert split.domains() == ["", "w"]


def test_manifest_records_files_inputs_and_counts(tmp_path: Path) -> None:
    source = tmp_path / "input.txt"
    source.write_text("raw input\n")
    with DatasetBuilder(tmp_path / "data", "test", 3) as dataset:
        dataset.add_input("source", source)
        with dataset.entities() as writer:
            for entity in _entities(3):
                writer.write(entity)
        with dataset.mentions("train") as mentions:
            mentions.write(MENTIONS[1])
        dataset.publish({"entities": 3})
    manifest = json.loads((tmp_path / "data" / MANIFEST_FILE).read_text())
    assert manifest["converter"] == {"name": "test", "version": 3}
    assert manifest["inputs"] == [
        {
            "role": "source",
            "path": str(source.resolve()),
            "bytes": 10,
            "sha256": sha256_file(source),
        }
    ]
    assert manifest["counts"] == {"entities": 3, "mentions": {"train": 1}}
    assert sorted(manifest["files"]) == [
        "entities/part-00000.parquet",
        "mentions/train.parquet",
        "summary.json",
    ]
    for name, entry in manifest["files"].items():
        assert entry["sha256"] == sha256_file(tmp_path / "data" / name)


def test_a_split_of_another_dataset_is_refused(tmp_path: Path) -> None:
    # two datasets of identical content: same file sizes, different dataset ids
    for name in ("a", "b"):
        write_dataset(tmp_path / name, _entities(4), {"train": MENTIONS})
    foreign = mention_split_path(tmp_path / "b", "train")
    shutil.copyfile(foreign, mention_split_path(tmp_path / "a", "train"))
    with pytest.raises(DatasetError, match="written for dataset"):
        MentionSplit.open(mention_split_path(tmp_path / "a", "train"))
    shutil.copyfile(foreign, mention_split_path(tmp_path / "a", "dev"))
    with pytest.raises(DatasetError, match=r"dev\.parquet: not part of the dataset"):
        EntityCatalogue.open(tmp_path / "a")


def test_open_checks_sizes_reads_check_pages_verify_checks_hashes(tmp_path: Path) -> None:
    write_dataset(tmp_path / "data", _entities(50))
    part = tmp_path / "data" / "entities" / "part-00000.parquet"
    payload = bytearray(part.read_bytes())
    text_chunk = pq.ParquetFile(part).metadata.row_group(0).column(3)
    flipped = payload.copy()  # a byte inside the text column's page: same size
    start = text_chunk.dictionary_page_offset or text_chunk.data_page_offset
    flipped[start + text_chunk.total_compressed_size // 2] ^= 0xFF
    part.write_bytes(bytes(flipped))
    catalogue = EntityCatalogue.open(tmp_path / "data")  # cheap checks pass: same size
    with pytest.raises(DatasetError, match=rf"{part}: not a readable Parquet file \(.*CRC"):
        catalogue.texts()
    with pytest.raises(DatasetError, match="sha256"):
        verify_dataset(tmp_path / "data")
    part.write_bytes(bytes(payload[:-1]))
    with pytest.raises(DatasetError, match="bytes"):
        EntityCatalogue.open(tmp_path / "data")
    footer = payload.copy()  # the footer's metadata, which no checksum covers, garbled
    start = len(footer) - 8 - int.from_bytes(footer[-8:-4], "little")
    footer[start : start + 16] = b"\xff" * 16
    part.write_bytes(bytes(footer))
    with pytest.raises(DatasetError, match=rf"{part}: not a readable Parquet file"):
        EntityCatalogue.open(tmp_path / "data")


def test_catalogue_fingerprint_comes_from_the_manifest(tmp_path: Path, monkeypatch) -> None:
    write_dataset(tmp_path / "data", _entities(5), rows_per_file=2)
    expected = hnce.cluster.stores.tables.CatalogueDigest()
    for entity in _entities(5):
        expected.add(entity)

    def no_hashing(path: Path) -> str:
        raise AssertionError(f"{path} was hashed")

    monkeypatch.setattr(hnce.cluster.stores.tables_read, "sha256_file", no_hashing)
    assert catalogue_fingerprint(tmp_path / "data") == expected.hexdigest()


def test_datasets_of_the_same_entities_share_their_catalogue_fingerprint(tmp_path: Path) -> None:
    """The fingerprint is the entities', not their files' (which carry each conversion's own
    dataset id): other mentions or another split into files keep it; any field of any entity,
    or their order, changes it."""
    fingerprint = catalogue_fingerprint(write_dataset(tmp_path / "a", _entities(5)).root)
    other_mentions = write_dataset(
        tmp_path / "b", _entities(5), {"test": MENTIONS[1:]}, rows_per_file=2
    )
    assert catalogue_fingerprint(other_mentions.root) == fingerprint
    changed = [
        _entities(4),
        *(
            [*_entities(4), Entity(4, *fields)]
            for fields in [
                ("key-4", "Title 2 é", "text 4 ✓", "d0"),
                ("key-4", "Title 1 é", "text 4 ✗", "d0"),
                ("key-4", "Title 1 é", "text 4 ✓", "d1"),
            ]
        ),
        [Entity(i, e.key, e.title, e.text, e.domain) for i, e in enumerate(_entities(5)[::-1])],
    ]
    for number, entities in enumerate(changed):
        root = write_dataset(tmp_path / f"changed-{number}", entities).root
        assert catalogue_fingerprint(root) != fingerprint, number


def test_unpublished_or_old_layout_is_refused(tmp_path: Path) -> None:
    (tmp_path / "old" / "entities").mkdir(parents=True)
    with pytest.raises(DatasetError, match=r"no manifest\.json"):
        EntityCatalogue.open(tmp_path / "old")
    with pytest.raises(DatasetError, match="no dataset"):
        EntityCatalogue.open(tmp_path / "absent")


def test_overwrite_replaces_everything_and_refuses_other_directories(tmp_path: Path) -> None:
    out = tmp_path / "data"
    write_dataset(out, _entities(3), {"train": MENTIONS, "dev": MENTIONS})
    (out / "tokens").mkdir()
    (out / "tokens" / "derived.npy").write_bytes(b"old")
    with pytest.raises(DatasetExistsError, match="--overwrite"):
        write_dataset(out, _entities(2))
    write_dataset(out, _entities(4), {"test": MENTIONS}, overwrite=True)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "entities/part-00000.parquet",
        MANIFEST_FILE,
        "mentions/test.parquet",
        "summary.json",
    ]
    assert len(EntityCatalogue.open(out)) == 4
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    with pytest.raises(DatasetExistsError, match="not a dataset"):
        write_dataset(home, _entities(1), overwrite=True)
    assert (home / "notes.txt").read_text() == "mine"


def test_an_output_that_appears_during_a_conversion_is_not_replaced(tmp_path: Path) -> None:
    out = tmp_path / "data"
    with pytest.raises(DatasetExistsError), DatasetBuilder(out, "test", 1) as dataset:
        with dataset.entities() as writer:
            writer.write(Entity(0, "a", "A", "x"))
        out.mkdir()
        (out / "mine.txt").write_text("mine")
        dataset.publish({})
    assert (out / "mine.txt").read_text() == "mine"
    assert [path.name for path in tmp_path.iterdir()] == ["data"]


def _mentions(count: int) -> list[Mention]:
    return [Mention(f"m{i}", "left ", f"Title {i % 3}", " right", i % 3) for i in range(count)]


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda m: m.pop("catalogue"), r"catalogue: Field required"),
        (lambda m: m["files"]["mentions/train.parquet"].pop("sha256"), r"sha256: Field required"),
        (lambda m: m.update(entity_files=["../elsewhere/part-00000.parquet"]), r"'\.\./elsewhere"),
        (lambda m: m.update(surprise=1), r"surprise: Unexpected keyword argument"),
    ],
)
def test_a_manifest_missing_a_field_or_naming_a_path_outside_is_refused(
    tmp_path: Path, change, problem: str
) -> None:
    write_dataset(tmp_path / "data", _entities(3), {"train": _mentions(4)})
    path = tmp_path / "data" / MANIFEST_FILE
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))
    with pytest.raises(DatasetError, match=problem):
        EntityCatalogue.open(tmp_path / "data")


def test_rows_read_are_checked_against_the_footer_and_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A damaged page can decode as fewer rows without an error of its own: every reader
    counts what it read."""
    write_dataset(tmp_path / "data", _entities(6), {"train": _mentions(5)})
    split = MentionSplit.open(mention_split_path(tmp_path / "data", "train"))
    catalogue = EntityCatalogue.open(tmp_path / "data")
    real = pq.ParquetFile.iter_batches

    def lose_the_last_row(self, *args, **kwargs):
        batches = list(real(self, *args, **kwargs))
        return iter([*batches[:-1], batches[-1].slice(0, batches[-1].num_rows - 1)])

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", lose_the_last_row)
    with pytest.raises(DatasetError, match=r"train\.parquet: read 4 rows but .* say 5"):
        split.read_all()
    with pytest.raises(DatasetError, match=r"part-00000\.parquet: read 5 rows but .* say 6"):
        list(catalogue.iter_batches())
