"""KILT knowledge source, BLINK entity.jsonl and AIDA on hand-written fixture files: field by
field, bad rows under both policies, and the converter's guarantees (reconverting replaces a
dataset whole, several files per split, where rejects may go, every input checked first, entity
markers and keys as written, an empty catalogue, numeric flags)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import write_jsonl

from hnce.cluster.stores.tables import MANIFEST_FILE, MISSING_GOLD, mention_split_path
from hnce.cluster.stores.tables_read import EntityCatalogue, MentionSplit
from hnce.pipeline.cli.main import main
from hnce.pipeline.data.bad_rows import BadRowError, BadRowPolicy
from hnce.pipeline.data.conversion import ConversionInputError, DatasetOutput, EmptyCatalogueError
from hnce.pipeline.data.kilt import aida_split_name, convert_kilt
from hnce.pipeline.data.kilt_predictions import read_kilt_inputs

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


def test_knowledge_source_and_aida_field_by_field(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "kilt_knowledgesource.json", PAGES)
    aida = write_jsonl(tmp_path / "aidayago2-train-kilt.jsonl", AIDA)
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
    entities = write_jsonl(tmp_path / "entity.jsonl", BLINK)
    aida = write_jsonl(tmp_path / "aidayago2-dev-kilt.jsonl", AIDA[:2])
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


def test_a_gold_missing_from_the_catalogue_fails_strict_mode_is_skipped_or_kept(
    tmp_path: Path,
) -> None:
    source = write_jsonl(tmp_path / "kilt_knowledgesource.json", PAGES)
    aida = write_jsonl(tmp_path / "aidayago2-test-kilt.jsonl", AIDA, json.dumps(MISSING))
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
    source = write_jsonl(tmp_path / "kilt_knowledgesource.json", PAGES)
    rows = [{key: value for key, value in row.items() if key != "output"} for row in AIDA]
    aida = write_jsonl(tmp_path / "aidayago2-test_without_answers-kilt.jsonl", rows)
    summary = convert_kilt(tmp_path / "out", [aida], knowledge_source=source)
    test = MentionSplit.open(mention_split_path(tmp_path / "out", "test")).read_all()
    assert [m.mention_id for m in test] == [row["id"] for row in AIDA]
    assert {m.gold for m in test} == {MISSING_GOLD}
    assert summary["mentions"] == {"test": len(AIDA)}
    labelled = write_jsonl(tmp_path / "aidayago2-test-kilt.jsonl", rows)
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
def test_a_bad_knowledge_source_row_fails_strict_mode_and_is_rejected_in_skip_mode(
    tmp_path: Path, kind: str
) -> None:
    source = write_jsonl(tmp_path / "kilt_knowledgesource.json", PAGES, BAD_PAGES[kind])
    aida = write_jsonl(tmp_path / "aidayago2-train-kilt.jsonl", AIDA)
    with pytest.raises(BadRowError, match=rf"{source}:4: {kind}: .* \(use --on-bad-row skip"):
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
def test_a_bad_aida_row_fails_strict_mode_and_is_rejected_in_skip_mode(
    tmp_path: Path, kind: str, line: str
) -> None:
    entities = write_jsonl(tmp_path / "entity.jsonl", BLINK)
    aida = write_jsonl(tmp_path / "aidayago2-train-kilt.jsonl", AIDA, line)
    with pytest.raises(BadRowError, match=rf"{aida}:5: {kind}"):
        convert_kilt(tmp_path / "strict", [aida], blink_entities=entities)
    summary = convert_kilt(_skip(tmp_path / "skip", tmp_path), [aida], blink_entities=entities)
    assert summary["bad_rows"]["rejected"][kind] == 1
    assert summary["mentions"] == {"train": 4}


def test_an_id_already_in_an_earlier_split_is_a_duplicate(tmp_path: Path) -> None:
    """Mention ids are unique across the dataset's splits, as Zeshel's converter has them: the
    same id in train and dev (a dev mention trained on) is a duplicate at its dev line."""
    entities = write_jsonl(tmp_path / "entity.jsonl", BLINK)
    train = write_jsonl(tmp_path / "aidayago2-train-kilt.jsonl", AIDA)
    dev_rows = [{**AIDA[0], "id": "d1"}]
    dev = write_jsonl(tmp_path / "aidayago2-dev-kilt.jsonl", dev_rows, json.dumps(AIDA[2]))
    with pytest.raises(BadRowError, match=rf"{dev}:2: duplicate_key"):
        convert_kilt(tmp_path / "strict", [train, dev], blink_entities=entities)
    skipped = _skip(tmp_path / "skip", tmp_path)
    summary = convert_kilt(skipped, [train, dev], blink_entities=entities)
    assert summary["bad_rows"]["rejected"]["duplicate_key"] == 1
    assert summary["mentions"] == {"train": 4, "dev": 1}


def test_blink_rejected_row_breaks_alignment_flag(tmp_path: Path) -> None:
    bad = json.dumps({"text": "x", "idx": "https://en.wikipedia.org/wiki?title=Nope", "title": "N"})
    entities = write_jsonl(tmp_path / "entity.jsonl", BLINK, bad)
    with pytest.raises(BadRowError, match=rf"{entities}:4: empty_key"):
        convert_kilt(tmp_path / "strict", [], blink_entities=entities)
    summary = convert_kilt(_skip(tmp_path / "skip", tmp_path), [], blink_entities=entities)
    assert summary["catalogue"]["entity_id_is_blink_row"] is False


def test_an_aida_file_name_gives_its_split() -> None:
    assert aida_split_name(Path("aidayago2-train-kilt.jsonl")) == "train"
    assert aida_split_name(Path("aidayago2-test_without_answers-kilt.jsonl")) == "test"


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_reconverting_replaces_the_whole_dataset_or_refuses(tmp_path: Path, capsys) -> None:
    source = write_jsonl(tmp_path / "kilt_knowledgesource.json", PAGES)
    train = write_jsonl(tmp_path / "aidayago2-train-kilt.jsonl", AIDA)
    dev_rows = [{**row, "id": f"dev-{row['id']}"} for row in AIDA[:2]]
    dev = write_jsonl(tmp_path / "aidayago2-dev-kilt.jsonl", dev_rows)
    out = tmp_path / "out"
    kilt = ["data", "kilt", "--knowledge-source", str(source), "--out", str(out)]
    assert main([*kilt, "--aida", str(train), str(dev)]) == 0
    old = {name: (out / name).read_bytes() for name in _files(out)}
    # without --overwrite: a clear message, exit 2, the old dataset untouched
    assert main([*kilt, "--aida", str(train)]) == 2
    assert "already holds a dataset" in capsys.readouterr().err
    assert {name: (out / name).read_bytes() for name in _files(out)} == old
    # a failed conversion with --overwrite leaves the old dataset as it was, and nothing else
    bad = write_jsonl(tmp_path / "aidayago2-test-kilt.jsonl", AIDA, "{broken")
    assert main([*kilt, "--overwrite", "--aida", str(bad)]) == 2
    assert {name: (out / name).read_bytes() for name in _files(out)} == old
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    # with --overwrite: no file of the old dataset survives (its dev split included)
    assert main([*kilt, "--overwrite", "--aida", str(train)]) == 0
    assert _files(out) == [
        "entities/part-00000.parquet",
        MANIFEST_FILE,
        "mentions/train.parquet",
        "summary.json",
    ]
    survivors = [
        name
        for name, payload in old.items()
        if (out / name).is_file() and (out / name).read_bytes() == payload
    ]
    assert survivors == [] and not mention_split_path(out, "dev").exists()


def test_several_files_of_a_split_are_concatenated_and_counted(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "kilt_knowledgesource.json", PAGES)
    first = write_jsonl(tmp_path / "aidayago2-train-kilt.jsonl", AIDA[:2])
    second = write_jsonl(tmp_path / "aidayago2-train_b-kilt.jsonl", AIDA[2:])
    summary = convert_kilt(tmp_path / "out", [first, second], knowledge_source=source)
    train = MentionSplit.open(mention_split_path(tmp_path / "out", "train")).read_all()
    assert [m.mention_id for m in train] == ["a1", "a2", "a3", "a4"]
    assert summary["mentions"] == {"train": 4}
    assert summary["mention_files"] == {
        "train": [{"file": str(first), "mentions": 2}, {"file": str(second), "mentions": 2}]
    }
    unlabelled = write_jsonl(tmp_path / "aidayago2-train_without_answers-kilt.jsonl", AIDA[:1])
    with pytest.raises(ValueError, match="mix labelled and unlabelled"):
        convert_kilt(tmp_path / "mixed", [first, unlabelled], knowledge_source=source)


def test_the_rejects_file_never_overwrites_an_input_or_any_other_file(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "kilt_knowledgesource.json", PAGES, "{broken")
    aida = write_jsonl(tmp_path / "aidayago2-train-kilt.jsonl", AIDA)
    before = aida.read_bytes()
    for rejects in (aida, tmp_path / "notes.txt"):
        rejects.write_bytes(rejects.read_bytes() if rejects.exists() else b"mine")
        output = DatasetOutput(tmp_path / "out", on_bad_row="skip", rejects=rejects)
        with pytest.raises(ConversionInputError, match="rejects"):
            convert_kilt(output, [aida], knowledge_source=source)
    assert aida.read_bytes() == before
    assert (tmp_path / "notes.txt").read_bytes() == b"mine"
    inside = DatasetOutput(tmp_path / "out", on_bad_row="skip", rejects=tmp_path / "out" / "r")
    with pytest.raises(ConversionInputError, match="inside --out"):
        convert_kilt(inside, [aida], knowledge_source=source)
    # the default: a new file inside the published dataset
    summary = convert_kilt(
        DatasetOutput(tmp_path / "out", on_bad_row="skip"), [aida], knowledge_source=source
    )
    assert summary["bad_rows"]["rejects_file"] == str(tmp_path / "out" / "rejects.jsonl")
    assert json.loads((tmp_path / "out" / "rejects.jsonl").read_text())["line"] == 4


def test_invalid_utf8_is_a_bad_row_with_file_and_line(tmp_path: Path) -> None:
    source = tmp_path / "kilt_knowledgesource.json"
    write_jsonl(source, PAGES)
    source.write_bytes(source.read_bytes() + b'{"wikipedia_id": "9\xff"}\n')
    lone = json.dumps({**PAGES[1], "wikipedia_id": "90", "wikipedia_title": "\ud800"})
    source.write_bytes(source.read_bytes() + lone.encode() + b"\n")
    aida = write_jsonl(tmp_path / "aidayago2-train-kilt.jsonl", AIDA)
    with pytest.raises(BadRowError, match=rf"{source}:4: invalid_utf8"):
        convert_kilt(tmp_path / "strict", [aida], knowledge_source=source)
    summary = convert_kilt(_skip(tmp_path / "skip", tmp_path), [aida], knowledge_source=source)
    assert summary["bad_rows"]["rejected"]["invalid_utf8"] == 2
    assert summary["entities"] == 3 and summary["mentions"] == {"train": 4}


def test_every_input_is_checked_before_any_work(tmp_path: Path) -> None:
    # the knowledge source would fail at its fourth line in strict mode: the missing AIDA file
    # must be reported first, before a single page is read
    source = write_jsonl(tmp_path / "kilt_knowledgesource.json", PAGES, "{broken")
    present = write_jsonl(tmp_path / "aidayago2-train-kilt.jsonl", AIDA)
    missing = tmp_path / "aidayago2-dev-kilt.jsonl"
    with pytest.raises(ConversionInputError, match=rf"input not found: aida {missing}"):
        convert_kilt(tmp_path / "out", [present, missing], knowledge_source=source)
    assert not (tmp_path / "out").exists()


def test_an_aida_input_needs_its_entity_markers_exactly_once(tmp_path: Path) -> None:
    entities = write_jsonl(tmp_path / "entity.jsonl", BLINK)
    doubled = {
        "id": "d1",
        "input": "in [START_ENT] [START_ENT] Germany [END_ENT] today",
        "output": [{"answer": "Germany", "provenance": [{"wikipedia_id": "34"}]}],
    }
    in_meta = _aida("d2", "in [START_ENT]", "Germany", "today", [{"wikipedia_id": "34"}], "x")
    aida = write_jsonl(tmp_path / "aidayago2-dev-kilt.jsonl", [doubled, in_meta, *AIDA])
    with pytest.raises(BadRowError, match=rf"{aida}:1: offsets_outside_context"):
        convert_kilt(tmp_path / "strict", [aida], blink_entities=entities)
    summary = convert_kilt(_skip(tmp_path / "skip", tmp_path), [aida], blink_entities=entities)
    assert summary["bad_rows"]["rejected"]["offsets_outside_context"] == 2
    dev = MentionSplit.open(mention_split_path(tmp_path / "skip", "dev")).read_all()
    assert not any("ENT]" in m.context_left + m.mention + m.context_right for m in dev)


def test_keys_are_matched_as_written_and_only_strings_or_integers_are_keys(tmp_path: Path) -> None:
    pages = [
        {**PAGES[0], "wikipedia_id": 100},
        {**PAGES[1], "wikipedia_id": "0100"},
        {**PAGES[2], "wikipedia_id": "١٠٠"},
        {**PAGES[1], "wikipedia_id": " 7 ", "wikipedia_title": "Seven"},
    ]
    source = write_jsonl(
        tmp_path / "kilt_knowledgesource.json",
        pages,
        json.dumps({**PAGES[1], "wikipedia_id": True}),
    )
    rows = [
        _aida("k1", "a", "Zürich", "b", [{"wikipedia_id": "100"}], "-"),
        _aida("k2", "a", "Germany", "b", [{"wikipedia_id": "0100"}], "-"),
        _aida("k3", "a", "Seven", "b", [{"wikipedia_id": 7}], "-"),
        _aida("k4", "a", "Seven", "b", [{"wikipedia_id": "7 "}], "-"),
    ]
    aida = write_jsonl(
        tmp_path / "aidayago2-train-kilt.jsonl", rows, json.dumps({**rows[0], "id": 1.5})
    )
    with pytest.raises(BadRowError, match=rf"{source}:5: invalid_key: wikipedia_id is a bool"):
        convert_kilt(tmp_path / "strict", [aida], knowledge_source=source)
    summary = convert_kilt(_skip(tmp_path / "skip", tmp_path), [aida], knowledge_source=source)
    assert summary["bad_rows"]["rejected"] == {
        **{kind: 0 for kind in summary["bad_rows"]["rejected"]},
        "invalid_key": 2,
    }
    catalogue = EntityCatalogue.open(tmp_path / "skip")
    assert catalogue.keys().to_pylist() == ["100", "0100", "١٠٠", "7"]
    train = MentionSplit.open(mention_split_path(tmp_path / "skip", "train")).read_all()
    assert [m.gold for m in train] == [0, 1, 3, 3]


def test_an_empty_catalogue_is_an_error_in_both_modes(tmp_path: Path) -> None:
    source = write_jsonl(
        tmp_path / "kilt_knowledgesource.json", [], json.dumps({"wikipedia_id": 1})
    )
    aida = write_jsonl(tmp_path / "aidayago2-train-kilt.jsonl", AIDA)
    with pytest.raises(BadRowError, match=rf"{source}:1: missing_field"):
        convert_kilt(tmp_path / "strict", [aida], knowledge_source=source)
    with pytest.raises(EmptyCatalogueError, match=r"no entity was converted.*missing_field.: 1"):
        convert_kilt(_skip(tmp_path / "skip", tmp_path), [aida], knowledge_source=source)
    source.write_text("\n")
    with pytest.raises(EmptyCatalogueError, match="rejected rows: none"):
        convert_kilt(tmp_path / "strict", [aida], knowledge_source=source)
    assert not (tmp_path / "strict").exists() and not (tmp_path / "skip").exists()
    assert not (tmp_path / "rejects.jsonl").exists()


def test_numeric_flags_below_one_are_refused(tmp_path: Path, capsys) -> None:
    source = write_jsonl(tmp_path / "kilt_knowledgesource.json", PAGES)
    for flag, value in (("--max-text-chars", "-5"), ("--max-text-chars", "0")):
        with pytest.raises(SystemExit) as exit_status:
            main(["data", "kilt", "--knowledge-source", str(source), flag, value])
        assert exit_status.value.code == 2
        assert "must be at least 1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="max-text-chars must be positive"):
        convert_kilt(tmp_path / "out", [], knowledge_source=source, max_text_chars=-5)
    with pytest.raises(SystemExit):
        main(["data", "synthetic", "--worlds", "0"])


BAD_BLINK = {
    "invalid_utf8": b'{"text": "\xff", "idx": "curid=78", "title": "X"}',
    "malformed_json": b'{"text": "x", "idx"',
    "missing_field": json.dumps({"text": "x", "idx": "curid=78"}).encode(),
    "duplicate_key": json.dumps({**BLINK[0], "title": "Other"}).encode(),
    "empty_key": json.dumps({**BLINK[0], "idx": "curid=-"}).encode(),
    "empty_text": json.dumps({**BLINK[0], "idx": "curid=78", "text": "  "}).encode(),
}


@pytest.mark.parametrize("kind", sorted(BAD_BLINK))
def test_a_bad_blink_entity_row_fails_strict_mode_and_breaks_row_alignment_in_skip_mode(
    tmp_path: Path, kind: str
) -> None:
    entities = write_jsonl(tmp_path / "entity.jsonl", BLINK)
    entities.write_bytes(entities.read_bytes() + BAD_BLINK[kind] + b"\n")
    with pytest.raises(BadRowError, match=rf"{entities}:4: {kind}"):
        convert_kilt(tmp_path / "strict", [], blink_entities=entities)
    summary = convert_kilt(_skip(tmp_path / "skip", tmp_path), [], blink_entities=entities)
    assert summary["bad_rows"]["rejected"] == {
        name: int(name == kind) for name in summary["bad_rows"]["rejected"]
    }
    assert summary["entities"] == 3
    assert summary["catalogue"]["entity_id_is_blink_row"] is False


def test_kilt_inputs_follow_the_bad_row_policy(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "aidayago2-test-kilt.jsonl", AIDA, json.dumps({"id": "z"}))
    with pytest.raises(BadRowError, match=rf"{path}:5: offsets_outside_context"):
        read_kilt_inputs(path)
    with BadRowPolicy("skip", tmp_path / "rejects.jsonl") as policy:
        inputs = read_kilt_inputs(path, policy)
    assert [item.id for item in inputs] == ["a1", "a2", "a3", "a4"]
    assert inputs[3].context_left == "Matches in" and inputs[3].mention == "Germany"
    assert policy.counts == {"offsets_outside_context": 1}


def test_overwrite_refuses_an_input_that_lies_inside_the_output(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    source = write_jsonl(tmp_path / "kilt_knowledgesource.json", PAGES)
    train = write_jsonl(tmp_path / "aidayago2-train-kilt.jsonl", AIDA)
    kilt = ["data", "kilt", "--knowledge-source", str(source), "--out", str(out)]
    assert main([*kilt, "--aida", str(train)]) == 0
    inside = write_jsonl(out / "aidayago2-dev-kilt.jsonl", AIDA[:2])  # kept in the dataset dir
    assert main([*kilt, "--overwrite", "--aida", str(inside)]) == 2
    assert "lies inside --out" in capsys.readouterr().err
    assert inside.is_file() and (out / MANIFEST_FILE).is_file()


def test_a_pipe_as_input_is_refused_before_any_work(tmp_path: Path, capsys) -> None:
    source = write_jsonl(tmp_path / "kilt_knowledgesource.json", PAGES)
    fifo = tmp_path / "aidayago2-train-kilt.jsonl"
    os.mkfifo(fifo)
    out = tmp_path / "out"
    kilt = ["data", "kilt", "--knowledge-source", str(source), "--out", str(out)]
    assert main([*kilt, "--aida", str(fifo)]) == 2
    assert "is not a regular file (a pipe or a device?)" in capsys.readouterr().err
    assert not out.exists()


def test_a_dangling_link_as_rejects_is_refused_and_left_alone(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "kilt_knowledgesource.json", PAGES)
    train = write_jsonl(tmp_path / "aidayago2-train-kilt.jsonl", AIDA)
    rejects = tmp_path / "rejects.jsonl"
    rejects.symlink_to(tmp_path / "elsewhere" / "target.jsonl")
    output = DatasetOutput(tmp_path / "out", on_bad_row="skip", rejects=rejects)
    with pytest.raises(ConversionInputError, match="already exists"):
        convert_kilt(output, [train], knowledge_source=source)
    assert rejects.is_symlink() and not (tmp_path / "elsewhere").exists()


def fill_disk_under(path: Path) -> None:
    """The disk under the open file ``path`` fills: from now on the OS refuses every write into
    it with ENOSPC (its descriptor becomes one of /dev/full's)."""
    real = os.path.realpath(path)
    fds = os.listdir("/proc/self/fd")
    mine = next(fd for fd in fds if os.path.realpath(f"/proc/self/fd/{fd}") == real)
    full = os.open("/dev/full", os.O_WRONLY)
    os.dup2(full, int(mine))
    os.close(full)


def fill_disk(monkeypatch: pytest.MonkeyPatch, name: str, when: str) -> None:
    """The disk fills while pyarrow writes the Parquet file ``name``: as the file opens, before a
    row group or before the footer (``when``), for each of pyarrow's own writes into the file
    (:func:`fill_disk_under`)."""

    class Writer(pq.ParquetWriter):
        def __init__(self, where: Path, schema: pa.Schema, **options: object) -> None:
            self.fill_at = when if Path(where).name == name else None
            self.real_path = Path(where)
            if self.fill_at == "open":
                Path(where).symlink_to("/dev/full")
            super().__init__(where, schema, **options)

        def write_batch(self, *args: object, **kwargs: object) -> None:
            self.fill("row group")
            super().write_batch(*args, **kwargs)

        def close(self) -> None:
            self.fill("footer")
            super().close()

        def fill(self, now: str) -> None:
            if self.fill_at == now:
                self.fill_at = None
                fill_disk_under(self.real_path)

    monkeypatch.setattr(pq, "ParquetWriter", Writer)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full")
@pytest.mark.parametrize(
    ("name", "when", "refused"),
    [
        ("part-00000.parquet", "open", "entities/part-00000.parquet"),
        ("part-00000.parquet", "row group", "entities/part-00000.parquet"),
        ("part-00000.parquet", "footer", "entities/part-00000.parquet"),
        ("train.parquet", "row group", "mentions/train.parquet"),  # after the catalogue
    ],
)
def test_a_full_disk_during_a_conversion_is_one_line_and_leaves_nothing(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch, name: str, when: str, refused: str
) -> None:
    """The first OS error is the one reported, naming the file (pyarrow's next words, "Operation
    on closed file", hid it, and the staging directory stayed)."""
    source = write_jsonl(tmp_path / "kilt_knowledgesource.json", PAGES)
    train = write_jsonl(tmp_path / "aidayago2-train-kilt.jsonl", AIDA)
    out = tmp_path / "data" / "out"
    fill_disk(monkeypatch, name, when)
    kilt = ["data", "kilt", "--knowledge-source", str(source), "--out", str(out)]
    assert main([*kilt, "--aida", str(train)]) == 74
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1, error
    staging = rf"{re.escape(str(tmp_path))}/data/\.building-out-[^/]+"
    assert re.fullmatch(rf"hnce data: {staging}/{refused}: No space left on device", error[0])
    assert list((tmp_path / "data").iterdir()) == []  # no dataset, no staging directory


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full")
@pytest.mark.parametrize(
    ("bad_rows", "split_too", "refused"),
    [
        (100, False, "rejects.jsonl"),  # more rejected bytes than the file buffers
        (2, True, r"data/\.building-out-[^/]+/mentions/train\.parquet"),  # refused first
    ],
    ids=["rejects", "split-then-rejects"],
)
def test_a_full_disk_under_the_rejects_file_is_one_line_and_leaves_nothing(
    tmp_path: Path,
    capsys,
    monkeypatch: pytest.MonkeyPatch,
    bad_rows: int,
    split_too: bool,
    refused: str,
) -> None:
    """The line named no file, or the rejects file where the split's file was refused first
    (closing the rejects file fails again while the conversion is undone), and that second
    failure left the staging directory and the rejects file behind."""
    source = write_jsonl(tmp_path / "kilt_knowledgesource.json", PAGES)
    train = write_jsonl(tmp_path / "aidayago2-train-kilt.jsonl", AIDA)
    with train.open("a") as handle:
        handle.writelines(f"not json {'x' * 200}\n" for _ in range(bad_rows))
    rejects = tmp_path / "rejects.jsonl"
    reject = BadRowPolicy.reject

    def on_a_full_disk(policy: BadRowPolicy, *args: object) -> None:
        first = policy.total == 0
        reject(policy, *args)
        if first:
            fill_disk_under(rejects)

    monkeypatch.setattr(BadRowPolicy, "reject", on_a_full_disk)
    if split_too:
        fill_disk(monkeypatch, "train.parquet", "row group")
    out = tmp_path / "data" / "out"
    kilt = ["data", "kilt", "--knowledge-source", str(source), "--out", str(out)]
    skip = ["--on-bad-row", "skip", "--rejects", str(rejects)]
    assert main([*kilt, "--aida", str(train), *skip]) == 74
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1, error
    where = rf"{re.escape(str(tmp_path))}/{refused}"
    assert re.fullmatch(rf"hnce data: {where}: No space left on device", error[0]), error
    assert list((tmp_path / "data").iterdir()) == [] and not rejects.exists()
