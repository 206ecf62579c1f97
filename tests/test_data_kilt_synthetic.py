"""The generated KILT knowledge source and AIDA files: exact formats, seeded output, a restart
after a crash that ends byte-identical, names shared across pages, and the lead lengths stated."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from hnce.errors import InputError
from hnce.pipeline.data import kilt_synthetic
from hnce.pipeline.data.kilt import convert_kilt, knowledge_source_text
from hnce.pipeline.data.kilt_synthetic import (
    GENERATOR_FILE,
    KNOWLEDGE_SOURCE,
    PARTS_DIR,
    KiltWorld,
    aida_file_name,
    generate_kilt_inputs,
)

MENTIONS = {"train": 40, "dev": 10, "test": 10}
PAGE_KEYS = {
    "_id",
    "wikipedia_id",
    "wikipedia_title",
    "text",
    "anchors",
    "categories",
    "history",
    "wikidata_info",
}


def _generate(out: Path, seed: int = 0, **options) -> dict:
    return generate_kilt_inputs(
        out, pages=300, seed=seed, mentions=MENTIONS, part_lines=64, **options
    )


def _contents(directory: Path) -> dict[str, bytes]:
    return {
        path.name: path.read_bytes()
        for path in sorted(directory.iterdir())
        if path.is_file() and path.name != GENERATOR_FILE
    }


def test_generated_kilt_files_follow_the_formats_and_convert_without_rejects(
    tmp_path: Path,
) -> None:
    _generate(tmp_path / "raw")
    pages = [json.loads(line) for line in (tmp_path / "raw" / KNOWLEDGE_SOURCE).open()]
    assert len(pages) == 300
    assert all(set(page) == PAGE_KEYS for page in pages)
    assert all(page["text"][0] == page["wikipedia_title"] + "\n" for page in pages)
    assert len({page["wikipedia_id"] for page in pages}) == 300
    assert len({page["wikipedia_title"] for page in pages}) == 300
    by_id = {page["wikipedia_id"]: page for page in pages}
    for split, count in MENTIONS.items():
        lines = [json.loads(x) for x in (tmp_path / "raw" / aida_file_name(split)).open()]
        assert len(lines) == count
        for line in lines:
            meta = line["meta"]
            assert line["input"] == (
                f"{meta['left_context']} [START_ENT] {meta['mention']} [END_ENT] "
                f"{meta['right_context']}"
            )
            (output,) = line["output"]
            (provenance,) = output["provenance"]
            assert by_id[provenance["wikipedia_id"]]["wikipedia_title"] == output["answer"]
    summary = convert_kilt(
        tmp_path / "data",
        [tmp_path / "raw" / aida_file_name(split) for split in MENTIONS],
        knowledge_source=tmp_path / "raw" / KNOWLEDGE_SOURCE,
    )
    assert summary["entities"] == 300
    assert summary["mentions"] == MENTIONS
    assert summary["bad_rows"]["rejected_total"] == 0


def test_seeded_and_restartable_after_a_crash(tmp_path: Path, monkeypatch) -> None:
    for name, seed in (("clean", 0), ("again", 0), ("other", 1)):
        _generate(tmp_path / name, seed)
    assert _contents(tmp_path / "again") == _contents(tmp_path / "clean")
    other = _contents(tmp_path / "other")
    assert other[KNOWLEDGE_SOURCE] != _contents(tmp_path / "clean")[KNOWLEDGE_SOURCE]

    original = KiltWorld.page_line

    def crash_at_200(world: KiltWorld, line: int) -> str:
        if line == 200:
            raise RuntimeError("killed")
        return original(world, line)

    monkeypatch.setattr(KiltWorld, "page_line", crash_at_200)
    with pytest.raises(RuntimeError, match="killed"):
        _generate(tmp_path / "crashed")
    parts = {p.name for p in (tmp_path / "crashed" / PARTS_DIR).iterdir()}
    # parts 0-2 (lines 0-191) are published whole; part 3 died and left nothing, not even a
    # temporary file (part 4 may have been queued to the worker already)
    assert {GENERATOR_FILE, "part-00000.jsonl", "part-00001.jsonl", "part-00002.jsonl"} <= parts
    assert "part-00003.jsonl" not in parts and not any(".tmp-" in name for name in parts)
    assert not (tmp_path / "crashed" / KNOWLEDGE_SOURCE).exists()
    monkeypatch.setattr(KiltWorld, "page_line", original)
    _generate(tmp_path / "crashed")
    assert _contents(tmp_path / "crashed") == _contents(tmp_path / "clean")
    assert not (tmp_path / "crashed" / PARTS_DIR).exists()


def test_gold_names_are_shared_by_other_pages() -> None:
    world = KiltWorld(pages=5000, seed=0)
    titles = [world.page(line).title for line in range(world.pages)]
    for number in range(200):
        line = json.loads(world.aida_line("train", number))
        mention = line["meta"]["mention"]
        sharing = [title for title in titles if mention.split()[-1] in title.split()]
        assert len(sharing) >= 2, mention
        assert line["output"][0]["answer"] in sharing


def test_lead_lengths_follow_the_stated_distribution() -> None:
    world = KiltWorld(pages=3000, seed=0)
    leads = [
        len(knowledge_source_text(json.loads(world.page_line(line))["text"], 10**6))
        for line in range(world.pages)
    ]
    assert 800 < statistics.median(leads) < 1100
    window = sum(length >= 640 for length in leads) / len(leads)
    assert 0.6 < window < 0.8
    assert max(leads) > 3000  # the long tail
    assert kilt_synthetic.LEAD_MEDIAN_CHARS == 900


def test_a_smaller_lead_median_writes_stubs_and_is_recorded(tmp_path: Path) -> None:
    world = KiltWorld(pages=3000, seed=0, lead_median_chars=150)
    leads = [
        len(knowledge_source_text(json.loads(world.page_line(line))["text"], 10**6))
        for line in range(world.pages)
    ]
    assert 150 < statistics.median(leads) < 300 and min(leads) >= 120  # a sentence past L
    record = _generate(tmp_path / "stubs", lead_median_chars=150)
    assert record["parameters"]["lead_median_chars"] == 150
    assert "lead_median_chars" not in _generate(tmp_path / "default")["parameters"]
    with pytest.raises(InputError, match="median"):
        KiltWorld(pages=300, lead_median_chars=100)
