"""KILT AIDA-CoNLL mentions and the KILT knowledge source to the Parquet contracts.

Inputs (DESIGN.md §6):

- ``kilt_knowledgesource.json``: one Wikipedia page per line, ``{wikipedia_id, wikipedia_title,
  text: [title line, paragraphs...], anchors, categories, history, wikidata_info}``. An entity's
  ``key`` is its ``wikipedia_id``; its text the paragraphs after the title line (section headers
  dropped, bullet markers stripped), cut at ``max_text_chars`` at a word boundary: the entity
  encoder reads 128 tokens, and the 5.9M full articles would not fit in memory or on disk.
- ``aidayago2-{train,dev,test}-kilt.jsonl``: ``{id, input, output: [{answer, provenance:
  [{wikipedia_id, title}]}], meta: {left_context, mention, right_context}}``; ``input`` marks
  the mention with ``[START_ENT]`` / ``[END_ENT]`` (used when ``meta`` is absent).

Golds are resolved against the catalogue by Wikipedia id first, then by title (provenance
title, then the answer). Every resolved entity goes into ``golds`` (first one = ``gold``). A
mention none of whose golds is in the catalogue is a ``gold_not_in_catalogue`` bad row, or, with
``keep_missing_gold``, is kept with ``gold = MISSING_GOLD`` so that evaluation counts it as an
error in unnormalized accuracy instead of silently dropping it. The catalogue may also come from
BLINK's ``entity.jsonl`` (:mod:`pipeline.data.blink`), whose row numbers are BLINK's entity ids.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from cluster.tables import (
    MISSING_GOLD,
    Entity,
    EntityCatalogue,
    EntityCatalogueWriter,
    Mention,
    MentionWriter,
    write_summary,
)
from pipeline.data.bad_rows import (
    BadRowKind,
    BadRowPolicy,
    JsonRow,
    iter_json_chunks,
    iter_json_lines,
)
from pipeline.data.blink import DEFAULT_MAX_TEXT_CHARS, convert_blink_entities, truncate_text

KNOWLEDGE_SOURCE_FIELDS = ("wikipedia_id", "wikipedia_title", "text")
START_ENT, END_ENT = "[START_ENT]", "[END_ENT]"
UNLABELLED_MARK = "without_answers"  # KILT's name for test files with no gold output
_AIDA_SPLIT = re.compile(r"-(train|dev|test)[^-]*-kilt")


def knowledge_source_text(paragraphs: Sequence[str], max_chars: int) -> str:
    """Entity text of a KILT page: paragraphs after the title line, without section headers."""
    kept: list[str] = []
    length = 0
    for paragraph in paragraphs[1:]:
        paragraph = paragraph.strip()
        if not paragraph or paragraph.startswith("Section::::"):
            continue
        paragraph = paragraph.removeprefix("BULLET::::").lstrip("- ").strip()
        kept.append(paragraph)
        length += len(paragraph) + 1
        if length > max_chars:
            break
    return truncate_text(" ".join(kept), max_chars)


def convert_knowledge_source(
    path: Path,
    out: Path,
    policy: BadRowPolicy,
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS,
) -> dict[str, Any]:
    """Stream ``kilt_knowledgesource.json`` into ``out/entities/``; return counts.

    Memory: one record batch of entities plus the set of Wikipedia ids seen (for duplicates).
    """
    seen: set[int | str] = set()
    with EntityCatalogueWriter(out) as writer:
        for row in tqdm(iter_json_lines(path, policy), desc="kilt knowledge source", unit=" pages"):
            if not row.require(policy, KNOWLEDGE_SOURCE_FIELDS):
                continue
            record = row.record
            key = str(record["wikipedia_id"]).strip()
            paragraphs = record["text"]
            if not key:
                row.reject(policy, BadRowKind.EMPTY_KEY, "empty wikipedia_id")
                continue
            seen_key: int | str = int(key) if key.isdigit() else key  # ints are smaller in a set
            if seen_key in seen:
                row.reject(policy, BadRowKind.DUPLICATE_KEY, f"duplicate wikipedia_id {key}")
                continue
            if not isinstance(paragraphs, list):
                row.reject(policy, BadRowKind.MISSING_FIELD, "text is not a list of paragraphs")
                continue
            text = knowledge_source_text([str(p) for p in paragraphs], max_text_chars)
            if not text:
                row.reject(policy, BadRowKind.EMPTY_TEXT, f"page {key} has no text")
                continue
            seen.add(seen_key)
            writer.write(Entity(writer.count, key, str(record["wikipedia_title"]), text))
        count = writer.count
    return {"source": str(path), "entities": count}


def aida_split_name(path: Path) -> str:
    """``aidayago2-dev-kilt.jsonl`` -> ``dev`` (``test_without_answers`` -> ``test``)."""
    match = _AIDA_SPLIT.search(Path(path).name)
    return match.group(1) if match else Path(path).stem


def _mention_parts(row: JsonRow) -> tuple[str, str, str] | None:
    meta = row.record.get("meta")
    if isinstance(meta, dict) and meta.get("mention") is not None:
        return (
            str(meta.get("left_context") or ""),
            str(meta["mention"]),
            str(meta.get("right_context") or ""),
        )
    text = row.record.get("input")
    if not isinstance(text, str):
        return None
    start, end = text.find(START_ENT), text.find(END_ENT)
    if start < 0 or end < start:
        return None
    return (
        text[:start].strip(),
        text[start + len(START_ENT) : end].strip(),
        text[end + len(END_ENT) :].strip(),
    )


def _gold_candidates(record: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Wikipedia ids and titles named by a row's outputs, in order."""
    ids: list[str] = []
    titles: list[str] = []
    outputs = record.get("output")
    for output in outputs if isinstance(outputs, list) else []:
        if not isinstance(output, dict):
            continue
        for provenance in output.get("provenance") or []:
            if isinstance(provenance, dict):
                if provenance.get("wikipedia_id") is not None:
                    ids.append(str(provenance["wikipedia_id"]))
                if provenance.get("title"):
                    titles.append(str(provenance["title"]))
        if output.get("answer"):
            titles.append(str(output["answer"]))
    return ids, titles


def convert_aida_split(
    path: Path,
    out: Path,
    catalogue: EntityCatalogue,
    policy: BadRowPolicy,
    keep_missing_gold: bool = False,
    split: str | None = None,
    chunk_size: int = 4096,
) -> dict[str, int]:
    """Convert one AIDA KILT file into ``out/mentions/<split>.parquet``; return counts.

    KILT's ``*-test_without_answers-kilt.jsonl`` rows carry no ``output``: they are written
    unlabelled, with ``gold = -1`` (``MISSING_GOLD``), so predictions cover every input id.
    """
    split = split or aida_split_name(path)
    unlabelled = UNLABELLED_MARK in Path(path).name
    required = ("id",) if unlabelled else ("id", "output")
    seen_ids: set[str] = set()
    missing_kept = 0
    with MentionWriter(out, split) as writer:
        for chunk in iter_json_chunks(path, policy, chunk_size):
            rows = [row for row in chunk if row.require(policy, required)]
            candidates = [([], []) if unlabelled else _gold_candidates(row.record) for row in rows]
            flat_ids = [key for ids, _ in candidates for key in ids]
            flat_titles = [title for _, titles in candidates for title in titles]
            by_id = iter(catalogue.ids_for_keys(flat_ids).tolist())
            by_title = iter(catalogue.ids_for_titles(flat_titles).tolist())
            for row, (ids, titles) in zip(rows, candidates, strict=True):
                resolved = [next(by_id) for _ in ids] + [next(by_title) for _ in titles]
                golds = list(dict.fromkeys(i for i in resolved if i >= 0))
                mention_id = str(row.record["id"])
                parts = _mention_parts(row)
                if mention_id in seen_ids:
                    row.reject(policy, BadRowKind.DUPLICATE_KEY, f"duplicate id {mention_id!r}")
                    continue
                if parts is None:
                    row.reject(
                        policy,
                        BadRowKind.OFFSETS_OUTSIDE_CONTEXT,
                        f"no meta and no {START_ENT} ... {END_ENT} span in input",
                    )
                    continue
                if not parts[1].strip():
                    row.reject(policy, BadRowKind.EMPTY_TEXT, f"mention {mention_id!r} is empty")
                    continue
                if unlabelled:
                    golds = [MISSING_GOLD]
                elif not golds:
                    if not keep_missing_gold:
                        row.reject(
                            policy,
                            BadRowKind.GOLD_NOT_IN_CATALOGUE,
                            f"no gold of {mention_id!r} in the catalogue "
                            f"(wikipedia ids {ids}, titles {titles})",
                        )
                        continue
                    golds = [MISSING_GOLD]
                    missing_kept += 1
                seen_ids.add(mention_id)
                writer.write(
                    Mention(mention_id, parts[0], parts[1], parts[2], golds[0], "", tuple(golds))
                )
        count = writer.count
    return {"mentions": count, "missing_gold_kept": missing_kept, "unlabelled": count * unlabelled}


def convert_kilt(
    out: Path,
    aida_files: Sequence[Path],
    knowledge_source: Path | None = None,
    blink_entities: Path | None = None,
    policy: BadRowPolicy | None = None,
    keep_missing_gold: bool = False,
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS,
) -> dict[str, Any]:
    """Build a KILT dataset directory: catalogue from the knowledge source or BLINK's
    ``entity.jsonl`` (exactly one), then the AIDA splits resolved against it."""
    if (knowledge_source is None) == (blink_entities is None):
        raise ValueError("give exactly one catalogue source: knowledge_source or blink_entities")
    out = Path(out)
    policy = policy or BadRowPolicy()
    if knowledge_source is not None:
        catalogue_summary = convert_knowledge_source(knowledge_source, out, policy, max_text_chars)
    else:
        assert blink_entities is not None
        catalogue_summary = convert_blink_entities(blink_entities, out, policy, max_text_chars)
    catalogue = EntityCatalogue.open(out)
    splits = {
        aida_split_name(path): convert_aida_split(path, out, catalogue, policy, keep_missing_gold)
        for path in aida_files
    }
    summary = {
        "format": "kilt",
        "catalogue": catalogue_summary,
        "entities": len(catalogue),
        "mentions": {split: counts["mentions"] for split, counts in splits.items()},
        "missing_gold_kept": sum(counts["missing_gold_kept"] for counts in splits.values()),
        "unlabelled": sum(counts["unlabelled"] for counts in splits.values()),
        "keep_missing_gold": keep_missing_gold,
        "bad_rows": policy.summary(),
    }
    write_summary(out, summary)
    return summary
