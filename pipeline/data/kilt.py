"""KILT AIDA-CoNLL mentions and the KILT knowledge source to the Parquet contracts.

Inputs (docs/input-formats.md):

- ``kilt_knowledgesource.json``: one Wikipedia page per line, ``{wikipedia_id, wikipedia_title,
  text: [title line, paragraphs...], anchors, categories, history, wikidata_info}``. An entity's
  ``key`` is its ``wikipedia_id``; its text the paragraphs after the title line (section headers
  dropped, bullet markers stripped), cut at ``max_text_chars`` at a word boundary: the entity
  encoder reads 128 tokens, and the 5.9M full articles would not fit in memory or on disk.
- ``aidayago2-{train,dev,test}-kilt.jsonl``: ``{id, input, output: [{answer, provenance:
  [{wikipedia_id, title}]}], meta: {left_context, mention, right_context}}``; ``input`` marks
  the mention with ``[START_ENT]`` / ``[END_ENT]`` (used when ``meta`` is absent), each exactly
  once. :func:`aida_input` is the one parser of such a line (``hnce finetune-blink``'s
  predictions read their inputs through it too). Several files of one split (``train`` and
  ``train_b``) are converted in the order given into the one split, each counted.

Keys are compared as written (:mod:`hnce.pipeline.data.fields`). Golds are resolved against the
catalogue by Wikipedia id first, then by title (provenance
title, then the answer). Every resolved entity goes into ``golds`` (first one = ``gold``). A
mention none of whose golds is in the catalogue is a ``gold_not_in_catalogue`` bad row, or, with
``keep_missing_gold``, is kept with ``gold = MISSING_GOLD`` so that evaluation counts it as an
error in unnormalized accuracy instead of silently dropping it. The catalogue may also come from
BLINK's ``entity.jsonl`` (:mod:`hnce.pipeline.data.blink`), whose row numbers are BLINK's entity ids.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

from hnce.cluster.stores.tables import MISSING_GOLD, Entity, Mention
from hnce.cluster.stores.tables_read import EntityCatalogue
from hnce.errors import InputError
from hnce.pipeline.data.bad_rows import BadRowKind, BadRowPolicy, InputRow, iter_json_chunks
from hnce.pipeline.data.blink import DEFAULT_MAX_TEXT_CHARS, convert_blink_entities, truncate_text
from hnce.pipeline.data.conversion import Conversion, DatasetOutput
from hnce.pipeline.data.fields import KeySet, key_and_title, source_key, write_unique_entities
from hnce.progress import progress_bar

CONVERTER_VERSION = 2
KNOWLEDGE_SOURCE_FIELDS = ("wikipedia_id", "wikipedia_title", "text")
START_ENT, END_ENT = "[START_ENT]", "[END_ENT]"
UNLABELLED_MARK = "without_answers"  # KILT's name for test files with no gold output
MENTION_PARTS = ("left_context", "mention", "right_context")
_AIDA_SPLIT = re.compile(r"-(train|dev|test)[^-]*-kilt")
_CHUNK = 8192


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


def _page(row: InputRow, policy: BadRowPolicy, max_chars: int) -> Entity | None:
    """The entity of one knowledge-source line (entity_id assigned when written), or None after
    reporting the bad row."""
    head = key_and_title(row, policy, KNOWLEDGE_SOURCE_FIELDS, "wikipedia_id", "wikipedia_title")
    if head is None:
        return None
    key, title = head
    paragraphs = row.record["text"]
    if not isinstance(paragraphs, list) or not all(isinstance(p, str) for p in paragraphs):
        row.reject(policy, BadRowKind.MISSING_FIELD, "text is not a list of paragraph strings")
        return None
    text = knowledge_source_text(paragraphs, max_chars)
    if not text:
        row.reject(policy, BadRowKind.EMPTY_TEXT, f"page {key} has no text")
        return None
    return Entity(-1, key, title, text)


def convert_knowledge_source(
    path: Path, conversion: Conversion, max_text_chars: int = DEFAULT_MAX_TEXT_CHARS
) -> dict[str, Any]:
    """Stream ``kilt_knowledgesource.json`` into the catalogue of ``conversion``; return counts.

    Memory: one chunk of pages, one record batch of entities and 8 bytes per page for the
    duplicate check (:class:`hnce.pipeline.data.fields.KeySet`).
    """
    policy = conversion.policy
    keys = KeySet()
    with conversion.builder.entities() as writer:
        progress = progress_bar(desc="kilt knowledge source", unit=" pages")
        for chunk in iter_json_chunks(path, policy, _CHUNK):
            pages = [(row, page) for row in chunk if (page := _page(row, policy, max_text_chars))]
            write_unique_entities(pages, writer, keys, policy, "wikipedia_id")
            progress.update(len(chunk))
        progress.close()
    return {"source": str(path), "entities": writer.count}


def aida_split_name(path: Path) -> str:
    """``aidayago2-dev-kilt.jsonl`` -> ``dev`` (``test_without_answers`` -> ``test``)."""
    match = _AIDA_SPLIT.search(Path(path).name)
    return match.group(1) if match else Path(path).stem


def is_unlabelled(path: Path) -> bool:
    """KILT's ``*-test_without_answers-kilt.jsonl`` rows carry no ``output``."""
    return UNLABELLED_MARK in Path(path).name


def group_aida_files(paths: Sequence[Path]) -> dict[str, list[Path]]:
    """The AIDA files of each split, in the order given. Files with and without answers mapping
    to one split are an accident (the same mentions twice): an error naming both."""
    groups: dict[str, list[Path]] = {}
    for path in map(Path, paths):
        groups.setdefault(aida_split_name(path), []).append(path)
    for split, files in groups.items():
        kinds = {is_unlabelled(path) for path in files}
        if len(kinds) > 1:
            raise InputError(
                f"split {split!r} would mix labelled and unlabelled files: "
                f"{', '.join(map(str, files))}; give one of them"
            )
    return groups


def _mention_parts_of_meta(
    row: InputRow, policy: BadRowPolicy, meta: dict
) -> tuple[str, ...] | None:
    parts = tuple("" if meta.get(name) is None else meta[name] for name in MENTION_PARTS)
    if not all(isinstance(part, str) for part in parts):
        row.reject(policy, BadRowKind.MISSING_FIELD, "meta contexts and mention must be strings")
        return None
    if any(marker in part for part in parts for marker in (START_ENT, END_ENT)):
        row.reject(
            policy,
            BadRowKind.OFFSETS_OUTSIDE_CONTEXT,
            f"meta holds a literal {START_ENT} / {END_ENT} marker",
        )
        return None
    return parts


def _mention_parts_of_input(row: InputRow, policy: BadRowPolicy) -> tuple[str, ...] | None:
    text = row.record.get("input")
    if not isinstance(text, str) or text.count(START_ENT) != 1 or text.count(END_ENT) != 1:
        row.reject(
            policy,
            BadRowKind.OFFSETS_OUTSIDE_CONTEXT,
            f"no meta, and input does not hold exactly one {START_ENT} ... {END_ENT} span",
        )
        return None
    start, end = text.find(START_ENT), text.find(END_ENT)
    if end < start:
        row.reject(policy, BadRowKind.OFFSETS_OUTSIDE_CONTEXT, f"{END_ENT} before {START_ENT}")
        return None
    return (
        text[:start].strip(),
        text[start + len(START_ENT) : end].strip(),
        text[end + len(END_ENT) :].strip(),
    )


def aida_input(row: InputRow, policy: BadRowPolicy) -> tuple[str, tuple[str, ...]] | None:
    """The id and (left context, mention, right context) of one AIDA KILT line, from ``meta``
    when present, else from the one marked span of ``input``; None after reporting a bad row
    (no id, an invalid id, no single span, an empty mention)."""
    if not row.require(policy, ("id",)):
        return None
    mention_id = source_key(row, policy, "id", row.record["id"])
    if mention_id is None:
        return None
    meta = row.record.get("meta")
    if isinstance(meta, dict) and meta.get("mention") is not None:
        parts = _mention_parts_of_meta(row, policy, meta)
    else:
        parts = _mention_parts_of_input(row, policy)
    if parts is None:
        return None
    if not parts[1].strip():
        row.reject(policy, BadRowKind.EMPTY_TEXT, f"mention {mention_id!r} is empty")
        return None
    return mention_id, parts


def _gold_candidates(row: InputRow, policy: BadRowPolicy) -> tuple[list[str], list[str]] | None:
    """Wikipedia ids and titles named by a row's outputs, in order; None after reporting an
    invalid provenance id."""
    ids: list[str] = []
    titles: list[str] = []
    outputs = row.record.get("output")
    for output in outputs if isinstance(outputs, list) else []:
        if not isinstance(output, dict):
            continue
        provenances = output.get("provenance")
        for provenance in provenances if isinstance(provenances, list) else []:
            if not isinstance(provenance, dict):
                continue
            if provenance.get("wikipedia_id") is not None:
                key = source_key(row, policy, "provenance wikipedia_id", provenance["wikipedia_id"])
                if key is None:
                    return None
                ids.append(key)
            if isinstance(provenance.get("title"), str) and provenance["title"]:
                titles.append(provenance["title"])
        if isinstance(output.get("answer"), str) and output["answer"]:
            titles.append(output["answer"])
    return ids, titles


def _resolve_aida_chunk(
    chunk: list[InputRow],
    catalogue: EntityCatalogue,
    policy: BadRowPolicy,
    unlabelled: bool,
    keep_missing_gold: bool,
    seen: KeySet,
) -> Iterator[Mention]:
    """The mentions of one chunk, golds looked up for the whole chunk at once."""
    parsed = []
    for row in chunk:
        if not unlabelled and not row.require(policy, ("output",)):
            continue
        found = aida_input(row, policy)
        candidates = ([], []) if unlabelled or found is None else _gold_candidates(row, policy)
        if found is not None and candidates is not None:
            parsed.append((row, *found, candidates))
    by_id = iter(catalogue.ids_for_keys([k for *_, (ids, _) in parsed for k in ids]).tolist())
    by_title = iter(catalogue.ids_for_titles([t for *_, (_, ts) in parsed for t in ts]).tolist())
    for row, mention_id, parts, (ids, titles) in parsed:
        resolved = [next(by_id) for _ in ids] + [next(by_title) for _ in titles]
        golds = list(dict.fromkeys(i for i in resolved if i >= 0)) or [MISSING_GOLD]
        if golds == [MISSING_GOLD] and not unlabelled and not keep_missing_gold:
            row.reject(
                policy,
                BadRowKind.GOLD_NOT_IN_CATALOGUE,
                f"no gold of {mention_id!r} in the catalogue (wikipedia ids {ids}, titles {titles})",
            )
            continue
        if not seen.add(mention_id):
            row.reject(policy, BadRowKind.DUPLICATE_KEY, f"duplicate id {mention_id!r}")
            continue
        yield Mention(mention_id, parts[0], parts[1], parts[2], golds[0], "", tuple(golds))


def convert_aida_split(
    paths: Sequence[Path],
    split: str,
    conversion: Conversion,
    catalogue: EntityCatalogue,
    seen: KeySet,
    keep_missing_gold: bool = False,
    chunk_size: int = 4096,
) -> dict[str, Any]:
    """Convert the AIDA KILT files of one split, in order, into ``mentions/<split>.parquet``.

    ``*-test_without_answers-kilt.jsonl`` rows are written unlabelled, with ``gold = -1``
    (``MISSING_GOLD``), so predictions cover every input id. ``seen``: the ids of the dataset's
    splits so far; an id seen in any split is a duplicate (a mention in train and test at once
    would leak the test into training). Returns the split's counts and each file's.
    """
    unlabelled = is_unlabelled(paths[0])
    files: list[dict[str, Any]] = []
    missing_kept = 0
    with conversion.builder.mentions(split) as writer:
        for path in paths:
            before = writer.count
            for chunk in iter_json_chunks(path, conversion.policy, chunk_size):
                for mention in _resolve_aida_chunk(
                    chunk, catalogue, conversion.policy, unlabelled, keep_missing_gold, seen
                ):
                    missing_kept += mention.gold == MISSING_GOLD and not unlabelled
                    writer.write(mention)
            files.append({"file": str(path), "mentions": writer.count - before})
    return {
        "mentions": writer.count,
        "files": files,
        "missing_gold_kept": missing_kept,
        "unlabelled": writer.count * unlabelled,
    }


def convert_kilt(
    output: DatasetOutput | Path,
    aida_files: Sequence[Path],
    knowledge_source: Path | None = None,
    blink_entities: Path | None = None,
    keep_missing_gold: bool | Collection[str] = False,
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS,
    converter: str = "kilt",
) -> dict[str, Any]:
    """Publish a KILT dataset: the catalogue from the knowledge source or BLINK's
    ``entity.jsonl`` (exactly one), then the AIDA splits resolved against it.

    ``keep_missing_gold``: True for every split, or the names of the splits (e.g. dev and test)
    whose mentions keep a gold missing from the catalogue as ``MISSING_GOLD``.
    """
    if (knowledge_source is None) == (blink_entities is None):
        raise ValueError("give exactly one catalogue source: knowledge_source or blink_entities")
    if max_text_chars <= 0:
        raise InputError(f"--max-text-chars must be positive, got {max_text_chars}")
    groups = group_aida_files(aida_files)
    source = Path(knowledge_source or blink_entities)  # type: ignore[arg-type]
    role = "knowledge_source" if knowledge_source is not None else "blink_entities"
    inputs = [(role, source), *(("aida", Path(path)) for path in aida_files)]
    with Conversion(output, converter, CONVERTER_VERSION, inputs) as conversion:
        with conversion.stage("catalogue"):
            if knowledge_source is not None:
                catalogue_summary = convert_knowledge_source(source, conversion, max_text_chars)
            else:
                catalogue_summary = convert_blink_entities(source, conversion, max_text_chars)
        catalogue = conversion.catalogue()
        splits = {}
        seen = KeySet()  # mention ids are unique across the splits, as in Zeshel's converter
        for split, paths in groups.items():
            keep = (
                keep_missing_gold
                if isinstance(keep_missing_gold, bool)
                else split in keep_missing_gold
            )
            with conversion.stage(f"mentions {split}"):
                splits[split] = convert_aida_split(paths, split, conversion, catalogue, seen, keep)
        return conversion.publish(
            {
                "format": converter,
                "catalogue": catalogue_summary,
                "entities": len(catalogue),
                "mentions": {split: counts["mentions"] for split, counts in splits.items()},
                "mention_files": {split: counts["files"] for split, counts in splits.items()},
                "missing_gold_kept": sum(counts["missing_gold_kept"] for counts in splits.values()),
                "unlabelled": sum(counts["unlabelled"] for counts in splits.values()),
                "keep_missing_gold": keep_missing_gold
                if isinstance(keep_missing_gold, bool)
                else sorted(keep_missing_gold),
            }
        )
