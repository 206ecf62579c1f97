"""KILT knowledge source, BLINK entity.jsonl and AIDA on hand-written fixture files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster.tables import MISSING_GOLD, EntityCatalogue, MentionSplit, mention_split_path
from pipeline.data.bad_rows import BadRowError
from pipeline.data.conversion import DatasetOutput
from pipeline.data.kilt import aida_split_name, convert_kilt

PAGES = [
    {
        "wikipedia_id": "12",
        "wikipedia_title": "Zürich",
        "text": [
            "Zürich\n",
            "Zürich is the largest city in Switzerland.\n",
            "Section::::History.\n",
            "BULLET::::- Founded by Romans.\n",
        ],
        "anchors": [],
        "categories": "Cities",
        "history": {},
        "wikidata_info": {},
    },
    {
        "wikipedia_id": "34",
        "wikipedia_title": "Germany",
        "text": ["Germany\n", "Germany is a country in Europe."],
        "anchors": [],
        "categories": "",
        "history": {},
        "wikidata_info": {},
    },
    {
        "wikipedia_id": "56",
        "wikipedia_title": "Björk",
        "text": ["Björk\n", "Björk is an Icelandic singer."],
        "anchors": [],
        "categories": "",
        "history": {},
        "wikidata_info": {},
    },
]
BLINK = [
    {
        "text": "Zürich is the largest city.",
        "idx": "https://en.wikipedia.org/wiki?curid=12",
        "title": "Zürich",
        "entity": "Zürich",
    },
    {
        "text": "Germany is a country.",
        "idx": "https://en.wikipedia.org/wiki?curid=34",
        "title": "Germany",
        "entity": "Germany",
    },
    {
        "text": "Björk is a singer.",
        "idx": "https://en.wikipedia.org/wiki?curid=56",
        "title": "Björk",
        "entity": "Björk",
    },
]


def _aida(
    row_id: str, left: str, mention: str, right: str, provenance: list[dict], answer: str
) -> dict:
    return {
        "id": row_id,
        "input": f"{left} [START_ENT] {mention} [END_ENT] {right}".strip(),
        "output": [{"answer": answer, "provenance": provenance}],
        "meta": {"left_context": left, "mention": mention, "right_context": right},
    }


AIDA = [
    # at the start of the context; resolved by wikipedia_id
    _aida(
        "a1", "", "Zürich", "beat Bayern .", [{"wikipedia_id": "12", "title": "Zürich"}], "Zürich"
    ),
    # at the end; the id is unknown, resolved by title
    _aida("a2", "A song by", "Björk", "", [{"wikipedia_id": "999", "title": "Björk"}], "Björk"),
    # two correct entities: both go to golds, the first is gold
    _aida(
        "a3",
        "in",
        "Germany",
        "today",
        [{"wikipedia_id": "34", "title": "Germany"}, {"wikipedia_id": "12", "title": "Zürich"}],
        "Germany",
    ),
    # no meta: the context comes from the [START_ENT] markers of input
    {
        "id": "a4",
        "input": "Matches in [START_ENT] Germany [END_ENT] ended .",
        "output": [
            {"answer": "Germany", "provenance": [{"wikipedia_id": "34", "title": "Germany"}]}
        ],
    },
]
MISSING = _aida(
    "a5", "see", "Atlantis", ".", [{"wikipedia_id": "777", "title": "Atlantis"}], "Atlantis"
)


def _skip(out: Path, tmp_path: Path) -> DatasetOutput:
    return DatasetOutput(out, on_bad_row="skip", rejects=tmp_path / "rejects.jsonl")


def _write(path: Path, rows: list, extra: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(row, ensure_ascii=False) for row in rows] + ([extra] if extra else [])
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_knowledge_source_and_aida_field_by_field(tmp_path: Path) -> None:
    source = _write(tmp_path / "kilt_knowledgesource.json", PAGES)
    aida = _write(tmp_path / "aidayago2-train-kilt.jsonl", AIDA)
    summary = convert_kilt(tmp_path / "out", [aida], knowledge_source=source)
    catalogue = EntityCatalogue.open(tmp_path / "out")
    zurich = catalogue.get(0)
    assert (zurich.key, zurich.title, zurich.domain) == ("12", "Zürich", "")
    assert zurich.text == "Zürich is the largest city in Switzerland. Founded by Romans."
    assert [e.key for e in catalogue.get_many([1, 2])] == ["34", "56"]
    mentions = MentionSplit.open(mention_split_path(tmp_path / "out", "train")).read_all()
    a1, a2, a3, a4 = mentions
    assert (a1.mention_id, a1.context_left, a1.mention, a1.context_right, a1.gold) == (
        "a1",
        "",
        "Zürich",
        "beat Bayern .",
        0,
    )
    assert (a2.context_left, a2.mention, a2.context_right, a2.gold) == ("A song by", "Björk", "", 2)
    assert (a3.gold, a3.golds) == (1, (1, 0))
    assert (a4.context_left, a4.mention, a4.context_right, a4.gold) == (
        "Matches in",
        "Germany",
        "ended .",
        1,
    )
    assert summary["mentions"] == {"train": 4}
    assert summary["entities"] == 3


def test_blink_catalogue_keeps_entity_id_equal_to_blink_row(tmp_path: Path) -> None:
    entities = _write(tmp_path / "entity.jsonl", BLINK)
    aida = _write(tmp_path / "aidayago2-dev-kilt.jsonl", AIDA[:2])
    summary = convert_kilt(tmp_path / "out", [aida], blink_entities=entities)
    catalogue = EntityCatalogue.open(tmp_path / "out")
    for row, entry in enumerate(BLINK):
        entity = catalogue.get(row)
        assert (entity.entity_id, entity.key, entity.title, entity.text) == (
            row,
            entry["idx"].rsplit("=", 1)[1],
            entry["title"],
            entry["text"],
        )
    assert summary["catalogue"]["entity_id_is_blink_row"] is True
    dev = MentionSplit.open(mention_split_path(tmp_path / "out", "dev")).read_all()
    assert [m.gold for m in dev] == [0, 2]


def test_missing_gold_strict_skip_and_kept(tmp_path: Path) -> None:
    source = _write(tmp_path / "kilt_knowledgesource.json", PAGES)
    aida = _write(tmp_path / "aidayago2-test-kilt.jsonl", AIDA, json.dumps(MISSING))
    with pytest.raises(BadRowError, match=rf"{aida}:5: gold_not_in_catalogue"):
        convert_kilt(tmp_path / "strict", [aida], knowledge_source=source)
    skipped = convert_kilt(_skip(tmp_path / "skip", tmp_path), [aida], knowledge_source=source)
    assert skipped["bad_rows"]["rejected"]["gold_not_in_catalogue"] == 1
    assert json.loads((tmp_path / "rejects.jsonl").read_text())["line"] == 5
    assert skipped["mentions"] == {"test": 4}
    kept = convert_kilt(tmp_path / "kept", [aida], knowledge_source=source, keep_missing_gold=True)
    test = MentionSplit.open(mention_split_path(tmp_path / "kept", "test")).read_all()
    assert (test[-1].mention_id, test[-1].gold) == ("a5", MISSING_GOLD)
    assert kept["missing_gold_kept"] == 1


def test_test_without_answers_converts_unlabelled(tmp_path: Path) -> None:
    source = _write(tmp_path / "kilt_knowledgesource.json", PAGES)
    rows = [{key: value for key, value in row.items() if key != "output"} for row in AIDA]
    aida = _write(tmp_path / "aidayago2-test_without_answers-kilt.jsonl", rows)
    summary = convert_kilt(tmp_path / "out", [aida], knowledge_source=source)
    test = MentionSplit.open(mention_split_path(tmp_path / "out", "test")).read_all()
    assert [m.mention_id for m in test] == [row["id"] for row in AIDA]
    assert {m.gold for m in test} == {MISSING_GOLD}
    assert summary["mentions"] == {"test": len(AIDA)}
    labelled = _write(tmp_path / "aidayago2-test-kilt.jsonl", rows)
    with pytest.raises(BadRowError, match=rf"{labelled}:1: missing_field"):
        convert_kilt(tmp_path / "strict", [labelled], knowledge_source=source)


BAD_PAGES = {
    "malformed_json": '{"wikipedia_id": "78", "text": [',
    "missing_field": json.dumps({"wikipedia_id": "78", "text": ["T", "x"]}),
    "duplicate_key": json.dumps(PAGES[0]),
    "empty_key": json.dumps({**PAGES[1], "wikipedia_id": ""}),
    "empty_text": json.dumps(
        {**PAGES[1], "wikipedia_id": "78", "text": ["Title\n", "Section::::A.\n"]}
    ),
}


@pytest.mark.parametrize("kind", sorted(BAD_PAGES))
def test_knowledge_source_bad_rows(tmp_path: Path, kind: str) -> None:
    source = _write(tmp_path / "kilt_knowledgesource.json", PAGES, BAD_PAGES[kind])
    aida = _write(tmp_path / "aidayago2-train-kilt.jsonl", AIDA)
    with pytest.raises(BadRowError, match=rf"{source}:4: {kind}"):
        convert_kilt(tmp_path / "strict", [aida], knowledge_source=source)
    summary = convert_kilt(_skip(tmp_path / "skip", tmp_path), [aida], knowledge_source=source)
    assert summary["bad_rows"]["rejected"] == {
        name: int(name == kind) for name in summary["bad_rows"]["rejected"]
    }
    assert json.loads((tmp_path / "rejects.jsonl").read_text())["row"] == BAD_PAGES[kind]
    assert summary["entities"] == 3


@pytest.mark.parametrize(
    ("kind", "line"),
    [
        ("offsets_outside_context", json.dumps({"id": "b1", "input": "no markers", "output": []})),
        ("empty_text", json.dumps(_aida("b2", "x", " ", "y", [{"wikipedia_id": "12"}], "Zürich"))),
        ("duplicate_key", json.dumps(AIDA[0])),
        ("missing_field", json.dumps({"input": "x"})),
    ],
)
def test_aida_bad_rows(tmp_path: Path, kind: str, line: str) -> None:
    entities = _write(tmp_path / "entity.jsonl", BLINK)
    aida = _write(tmp_path / "aidayago2-train-kilt.jsonl", AIDA, line)
    with pytest.raises(BadRowError, match=rf"{aida}:5: {kind}"):
        convert_kilt(tmp_path / "strict", [aida], blink_entities=entities)
    summary = convert_kilt(_skip(tmp_path / "skip", tmp_path), [aida], blink_entities=entities)
    assert summary["bad_rows"]["rejected"][kind] == 1
    assert summary["mentions"] == {"train": 4}


def test_blink_rejected_row_breaks_alignment_flag(tmp_path: Path) -> None:
    bad = json.dumps({"text": "x", "idx": "https://en.wikipedia.org/wiki?title=Nope", "title": "N"})
    entities = _write(tmp_path / "entity.jsonl", BLINK, bad)
    with pytest.raises(BadRowError, match=rf"{entities}:4: empty_key"):
        convert_kilt(tmp_path / "strict", [], blink_entities=entities)
    summary = convert_kilt(_skip(tmp_path / "skip", tmp_path), [], blink_entities=entities)
    assert summary["catalogue"]["entity_id_is_blink_row"] is False


def test_aida_split_names() -> None:
    assert aida_split_name(Path("aidayago2-train-kilt.jsonl")) == "train"
    assert aida_split_name(Path("aidayago2-test_without_answers-kilt.jsonl")) == "test"
