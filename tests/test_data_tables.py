"""The Parquet contracts of cluster/tables.py: round trips, dense ids, look-ups, atomic writes."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from cluster.tables import (
    ENTITY_SCHEMA,
    MENTION_SCHEMA,
    Entity,
    EntityCatalogue,
    EntityCatalogueWriter,
    Mention,
    MentionSplit,
    MentionWriter,
    mention_split_path,
    read_summary,
    write_summary,
)


def _entities(count: int) -> list[Entity]:
    return [
        Entity(i, f"key-{i}", f"Title {i % 3} é", f"text {i} ✓", f"d{i % 2}") for i in range(count)
    ]


def test_catalogue_round_trip_over_several_files_and_row_groups(tmp_path: Path) -> None:
    entities = _entities(11)
    with EntityCatalogueWriter(tmp_path, rows_per_file=4, batch_size=3) as writer:
        for entity in entities:
            writer.write(entity)
    catalogue = EntityCatalogue.open(tmp_path)
    assert len(catalogue) == 11
    assert len(catalogue.files) == 3
    assert pq.read_schema(catalogue.files[0]) == ENTITY_SCHEMA
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


def test_catalogue_key_and_title_lookups(tmp_path: Path) -> None:
    with EntityCatalogueWriter(tmp_path) as writer:
        for entity in _entities(7):
            writer.write(entity)
    catalogue = EntityCatalogue.open(tmp_path)
    assert catalogue.id_for_key("key-6") == 6
    assert catalogue.ids_for_keys(["key-2", "absent", "key-0"]).tolist() == [2, -1, 0]
    assert catalogue.ids_for_title("Title 1 é") == [1, 4]
    assert catalogue.ids_for_titles(["Title 2 é", "nope"]).tolist() == [2, -1]
    with pytest.raises(KeyError, match="absent"):
        catalogue.id_for_key("absent")
    with pytest.raises(IndexError):
        catalogue.get(7)


def test_writer_requires_dense_ids_and_leaves_nothing_on_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="dense"), EntityCatalogueWriter(tmp_path) as writer:
        writer.write(Entity(0, "a", "A", "x"))
        writer.write(Entity(2, "b", "B", "y"))
    assert not list((tmp_path / "entities").iterdir())


def test_mentions_round_trip_and_golds_start_with_gold(tmp_path: Path) -> None:
    mentions = [
        Mention("m0", "", "Zoë", " drinks café", 3, "w", (1, 3)),
        Mention("m1", "at the end ", "Zürich", "", 0),
    ]
    with MentionWriter(tmp_path, "dev", batch_size=1) as writer:
        for mention in mentions:
            writer.write(mention)
    path = mention_split_path(tmp_path, "dev")
    assert pq.read_schema(path) == MENTION_SCHEMA
    split = MentionSplit.open(path)
    assert len(split) == 2
    read = split.read_all()
    assert read == mentions
    assert read[0].golds == (3, 1)
    assert read[1].golds == (0,)
    assert [len(batch) for batch in split.iter_batches(batch_size=1)] == [1, 1]
    assert split.domains() == ["", "w"]


def test_summary_round_trip(tmp_path: Path) -> None:
    write_summary(tmp_path, {"entities": 3, "mentions": {"train": 1}})
    assert read_summary(tmp_path) == {"entities": 3, "mentions": {"train": 1}}
