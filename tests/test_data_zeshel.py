"""Zeshel converter on hand-written fixture files, and every bad-row kind (strict and skip)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import write_jsonl

from hnce.cluster.stores.tables import MISSING_GOLD, mention_split_path
from hnce.cluster.stores.tables_read import EntityCatalogue, MentionSplit
from hnce.errors import InputError
from hnce.pipeline.data.bad_rows import BadRowError
from hnce.pipeline.data.conversion import DatasetOutput
from hnce.pipeline.data.zeshel import convert_zeshel

STAR_TREK = [
    {"document_id": "A1", "title": "Kirk", "text": "Kirk is the captain of the Enterprise ."},
    {
        "document_id": "A2",
        "title": "Enterprise",
        "text": "The Enterprise is a starship led by Kirk",
    },
]
CAFE = [
    {"document_id": "B1", "title": "Zoë", "text": "Zoë drinks café au lait in Zürich"},
    {"document_id": "B2", "title": "Zürich", "text": "Zürich is a city where Zoë lives"},
]


def _mention(
    mention_id: str, context: str, corpus: str, start: int, end: int, text: str, label: str
) -> dict:
    return {
        "mention_id": mention_id,
        "context_document_id": context,
        "corpus": corpus,
        "start_index": start,
        "end_index": end,
        "text": text,
        "label_document_id": label,
        "category": "LOW_OVERLAP",
    }


TRAIN = [
    _mention("m1", "A1", "star_trek", 0, 0, "Kirk", "A1"),  # first token of the context
    _mention("m2", "A2", "star_trek", 7, 7, "Kirk", "A1"),  # last token of the context
    _mention("m3", "B1", "café", 6, 6, "Zürich", "B2"),
]
VAL = [_mention("m4", "A1", "star_trek", 5, 6, "the Enterprise", "A2")]


def write_fixture(
    root: Path, bad_document: str | None = None, bad_mention: str | None = None
) -> Path:
    write_jsonl(root / "documents" / "star_trek.json", STAR_TREK, bad_document)
    write_jsonl(root / "documents" / "café.json", CAFE)
    write_jsonl(root / "mentions" / "train.json", TRAIN, bad_mention)
    write_jsonl(root / "mentions" / "val.json", VAL)
    return root


def test_conversion_field_by_field(tmp_path: Path) -> None:
    source = write_fixture(tmp_path / "zeshel")
    summary = convert_zeshel(source, tmp_path / "out")
    catalogue = EntityCatalogue.open(tmp_path / "out")
    # documents files in sorted order: café.json before star_trek.json
    assert [(e.entity_id, e.key, e.title, e.domain) for e in catalogue.get_many(range(4))] == [
        (0, "B1", "Zoë", "café"),
        (1, "B2", "Zürich", "café"),
        (2, "A1", "Kirk", "star_trek"),
        (3, "A2", "Enterprise", "star_trek"),
    ]
    assert catalogue.get(0).text == "Zoë drinks café au lait in Zürich"
    train = MentionSplit.open(mention_split_path(tmp_path / "out", "train")).read_all()
    first, last, unicode = train
    assert (first.mention_id, first.context_left, first.mention, first.context_right) == (
        "m1",
        "",
        "Kirk",
        "is the captain of the Enterprise .",
    )
    assert (first.gold, first.domain, first.golds) == (2, "star_trek", (2,))
    assert (last.context_left, last.mention, last.context_right, last.gold) == (
        "The Enterprise is a starship led by",
        "Kirk",
        "",
        2,
    )
    assert (unicode.context_left, unicode.mention, unicode.context_right, unicode.gold) == (
        "Zoë drinks café au lait in",
        "Zürich",
        "",
        1,
    )
    assert unicode.domain == "café"
    (dev,) = MentionSplit.open(mention_split_path(tmp_path / "out", "dev")).read_all()
    assert (dev.context_left, dev.mention, dev.context_right, dev.gold) == (
        "Kirk is the captain of",
        "the Enterprise",
        ".",
        3,
    )
    assert summary["entities"] == 4
    assert summary["mentions"] == {"train": 3, "dev": 1}
    assert summary["entities_per_domain"] == {"café": 2, "star_trek": 2}
    assert summary["bad_rows"]["rejected_total"] == 0


BAD_ROWS = {
    "malformed_json": ("mention", '{"mention_id": "bad", '),
    "missing_field": ("mention", json.dumps({"mention_id": "bad", "corpus": "star_trek"})),
    "offsets_outside_context": (
        "mention",
        json.dumps(_mention("bad", "A1", "star_trek", 3, 99, "x", "A1")),
    ),
    "gold_not_in_catalogue": (
        "mention",
        json.dumps(_mention("bad", "A1", "star_trek", 0, 0, "Kirk", "NOPE")),
    ),
    "duplicate_key": ("document", json.dumps(STAR_TREK[0])),
    "empty_key": ("document", json.dumps({"document_id": " ", "title": "t", "text": "x"})),
    "empty_text": ("document", json.dumps({"document_id": "A3", "title": "t", "text": "  "})),
}


def _fixture_with_bad_row(root: Path, kind: str) -> Path:
    """The fixture with the bad row of ``kind`` (BAD_ROWS) last in star_trek.json (a document)
    or in train.json (a mention)."""
    where, line = BAD_ROWS[kind]
    return write_fixture(
        root,
        bad_document=line if where == "document" else None,
        bad_mention=line if where == "mention" else None,
    )


@pytest.mark.parametrize("kind", sorted(BAD_ROWS))
def test_bad_row_strict_names_file_and_line(tmp_path: Path, kind: str) -> None:
    where, _ = BAD_ROWS[kind]
    source = _fixture_with_bad_row(tmp_path / "zeshel", kind)
    bad_file = (
        source / "documents" / "star_trek.json"
        if where == "document"
        else source / "mentions" / "train.json"
    )
    line_number = 3 if where == "document" else 4
    with pytest.raises(BadRowError, match=rf"{kind}") as error:
        convert_zeshel(source, tmp_path / "out")
    assert f"{bad_file}:{line_number}:" in str(error.value)
    assert error.value.line == line_number


@pytest.mark.parametrize("kind", sorted(BAD_ROWS))
def test_bad_row_skip_counts_and_rejects(tmp_path: Path, kind: str) -> None:
    where, line = BAD_ROWS[kind]
    source = _fixture_with_bad_row(tmp_path / "zeshel", kind)
    rejects = tmp_path / "rejects.jsonl"
    summary = convert_zeshel(
        source, DatasetOutput(tmp_path / "out", on_bad_row="skip", rejects=rejects)
    )
    assert summary["bad_rows"]["rejected"][kind] == 1
    assert summary["bad_rows"]["rejected_total"] == 1
    (record,) = [json.loads(x) for x in rejects.read_text(encoding="utf-8").splitlines()]
    assert record["kind"] == kind
    assert record["row"] == line
    assert record["line"] == (3 if where == "document" else 4)
    # the good rows are all there
    assert summary["entities"] == 4
    assert summary["mentions"] == {"train": 3, "dev": 1}


def test_keep_missing_gold_keeps_mention_with_gold_minus_one(tmp_path: Path) -> None:
    source = write_fixture(tmp_path / "zeshel", bad_mention=BAD_ROWS["gold_not_in_catalogue"][1])
    summary = convert_zeshel(source, tmp_path / "out", keep_missing_gold=True)
    train = MentionSplit.open(mention_split_path(tmp_path / "out", "train")).read_all()
    assert train[-1].mention_id == "bad"
    assert train[-1].gold == MISSING_GOLD
    assert summary["missing_gold_kept"] == 1
    assert summary["bad_rows"]["rejected_total"] == 0


def test_val_and_valid_together_are_an_error_naming_both(tmp_path: Path) -> None:
    source = write_fixture(tmp_path / "zeshel")
    write_jsonl(source / "mentions" / "valid.json", VAL)
    with pytest.raises(InputError, match=r"val\.json and .*valid\.json are both the 'dev' split"):
        convert_zeshel(source, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_ids_are_compared_as_written_on_both_sides(tmp_path: Path) -> None:
    source = write_fixture(tmp_path / "zeshel")
    numbered = [{"document_id": 7, "title": "Seven", "text": "Seven is a number"}]
    write_jsonl(source / "documents" / "numbers.json", numbered)
    mentions = [
        _mention("n1", " 7", "numbers", 0, 0, "Seven", "A1"),  # int key 7 as " 7"
        {**_mention("n2", "A1", "star_trek", 0, 0, "Kirk", "A1"), "label_document_id": 7},
        {**_mention("n3", "A1", "star_trek", 0, 0, "Kirk", "A1"), "label_document_id": True},
    ]
    write_jsonl(source / "mentions" / "test.json", mentions)
    summary = convert_zeshel(
        source, DatasetOutput(tmp_path / "out", on_bad_row="skip", rejects=tmp_path / "r.jsonl")
    )
    test = MentionSplit.open(mention_split_path(tmp_path / "out", "test")).read_all()
    catalogue = EntityCatalogue.open(tmp_path / "out")
    assert [(m.mention_id, m.context_left + "|" + m.mention, m.gold) for m in test] == [
        ("n1", "|Seven", catalogue.id_for_key("A1")),
        ("n2", "|Kirk", catalogue.id_for_key("7")),
    ]
    assert summary["bad_rows"]["rejected"]["invalid_key"] == 1
