"""Zeshel (zero-shot entity linking, Logeswaran et al. 2019) to the Parquet contracts.

Input (docs/input-formats.md)::

    documents/<world>.json   lines {document_id, title, text}
    mentions/<split>.json    lines {mention_id, context_document_id, corpus, start_index,
                                    end_index, text, label_document_id, category}

``start_index`` / ``end_index`` are *inclusive* positions of whitespace tokens in the context
document's text; the mention is ``tokens[start:end + 1]``, the left context the tokens before it
and the right context the tokens after it (whole document, the encoder truncates around the
mention). One domain per world; ``val`` (or ``valid``, but not both: that is an error naming
the two files) becomes the ``dev`` split. Ids are compared as written (:mod:`hnce.pipeline.data.fields`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hnce.cluster.stores.tables import MISSING_GOLD, Entity, Mention
from hnce.cluster.stores.tables_read import EntityCatalogue
from hnce.errors import InputError
from hnce.pipeline.data.bad_rows import BadRowKind, BadRowPolicy, InputRow, iter_json_chunks
from hnce.pipeline.data.conversion import Conversion, DatasetOutput
from hnce.pipeline.data.fields import (
    KeySet,
    key_and_title,
    source_key,
    text_field,
    write_unique_entities,
)
from hnce.progress import progress_bar

CONVERTER_VERSION = 2
#: Zeshel split file stems and the split names they are written under.
SPLIT_NAMES: dict[str, str] = {"train": "train", "val": "dev", "valid": "dev", "test": "test"}
DOCUMENT_FIELDS = ("document_id", "title", "text")
MENTION_FIELDS = (
    "mention_id",
    "context_document_id",
    "corpus",
    "start_index",
    "end_index",
    "label_document_id",
)
_CHUNK = 8192


def mention_files_by_split(zeshel_dir: Path) -> dict[str, Path]:
    """``mentions/<stem>.json`` by split name; two files of one split is an error naming both."""
    files: dict[str, Path] = {}
    for path in sorted((Path(zeshel_dir) / "mentions").glob("*.json")):
        split = SPLIT_NAMES.get(path.stem, path.stem)
        if split in files:
            raise InputError(
                f"{files[split]} and {path} are both the {split!r} split; keep one of them"
            )
        files[split] = path
    return files


def convert_zeshel(
    zeshel_dir: Path,
    output: DatasetOutput | Path,
    keep_missing_gold: bool = False,
    chunk_size: int = 10_000,
    converter: str = "zeshel",
    describe: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Convert a Zeshel directory and publish it as the dataset ``output``; return the summary.

    Args:
        zeshel_dir: holds ``documents/`` and ``mentions/``.
        output: the dataset to publish, with the bad-row policy (strict by default).
        keep_missing_gold: keep mentions whose label document is not in the catalogue with
            ``gold = MISSING_GOLD`` (counted, for evaluation that must score them as errors)
            instead of treating them as bad rows.
        chunk_size: mentions resolved together (bounds memory: their context documents).
        converter: the name recorded in the manifest and summary (``synthetic`` for the
            generated worlds, which go through this converter).
        describe: more summary entries (the synthetic generator's parameters).
    """
    zeshel_dir = Path(zeshel_dir)
    document_files = sorted((zeshel_dir / "documents").glob("*.json"))
    if not document_files:
        raise InputError(f"no Zeshel documents/*.json under {zeshel_dir}")
    mention_files = mention_files_by_split(zeshel_dir)
    inputs = [("documents", path) for path in document_files]
    inputs += [(f"mentions {split}", path) for split, path in mention_files.items()]
    with Conversion(output, converter, CONVERTER_VERSION, inputs) as conversion:
        with conversion.stage("catalogue"):
            entities_per_domain = _write_documents(document_files, conversion)
        catalogue = conversion.catalogue()
        mention_counts: dict[str, int] = {}
        missing_kept = 0
        seen_mentions = KeySet()
        for split, path in mention_files.items():
            with (
                conversion.stage(f"mentions {split}"),
                conversion.builder.mentions(split) as writer,
            ):
                for chunk in iter_json_chunks(path, conversion.policy, chunk_size):
                    for mention in _resolve_chunk(
                        chunk, catalogue, conversion.policy, keep_missing_gold, seen_mentions
                    ):
                        missing_kept += mention.gold == MISSING_GOLD
                        writer.write(mention)
            mention_counts[split] = writer.count
        summary = {
            "format": converter,
            "source": str(zeshel_dir),
            "entities": len(catalogue),
            "entities_per_domain": dict(sorted(entities_per_domain.items())),
            "mentions": mention_counts,
            "missing_gold_kept": missing_kept,
            **(describe or {}),
        }
        return conversion.publish(summary)


def _document(row: InputRow, policy: BadRowPolicy, world: str) -> Entity | None:
    head = key_and_title(row, policy, DOCUMENT_FIELDS, "document_id", "title")
    if head is None:
        return None
    key, title = head
    text = text_field(row, policy, "text")
    if text is None:
        return None
    if not text.strip():
        row.reject(policy, BadRowKind.EMPTY_TEXT, f"document {key!r} has empty text")
        return None
    return Entity(-1, key, title, text, world)


def _write_documents(files: list[Path], conversion: Conversion) -> Counter[str]:
    policy = conversion.policy
    per_domain: Counter[str] = Counter()
    keys = KeySet()
    with conversion.builder.entities() as writer:
        for path in files:
            world = path.stem
            before = writer.count
            for chunk in progress_bar(
                iter_json_chunks(path, policy, _CHUNK), desc=f"zeshel {world}", leave=False
            ):
                documents = [(row, doc) for row in chunk if (doc := _document(row, policy, world))]
                write_unique_entities(documents, writer, keys, policy, "document_id")
            per_domain[world] += writer.count - before
    return per_domain


def _mention_keys(row: InputRow, policy: BadRowPolicy) -> tuple[str, str, str, str] | None:
    """mention_id, context and label document ids, corpus; None after reporting a bad row."""
    if not row.require(policy, MENTION_FIELDS):
        return None
    keys = []
    for name in ("mention_id", "context_document_id", "label_document_id"):
        key = source_key(row, policy, name, row.record[name])
        if key is None:
            return None
        keys.append(key)
    corpus = text_field(row, policy, "corpus")
    return None if corpus is None else (keys[0], keys[1], keys[2], corpus)


def _resolve_chunk(
    chunk: list[InputRow],
    catalogue: EntityCatalogue,
    policy: BadRowPolicy,
    keep_missing_gold: bool,
    seen_mentions: KeySet,
) -> Iterator[Mention]:
    rows = [(row, keys) for row in chunk if (keys := _mention_keys(row, policy))]
    context_ids = catalogue.ids_for_keys([keys[1] for _, keys in rows])
    gold_ids = catalogue.ids_for_keys([keys[2] for _, keys in rows])
    wanted = sorted({int(i) for i in context_ids if i >= 0})
    context_text = {e.entity_id: e.text for e in catalogue.get_many(wanted)}
    for (row, keys), context_id, gold_id in zip(rows, context_ids, gold_ids, strict=True):
        mention = _mention(row, policy, keys, context_text.get(int(context_id)))
        if mention is None:
            continue
        if gold_id < 0:
            if not keep_missing_gold:
                row.reject(
                    policy,
                    BadRowKind.GOLD_NOT_IN_CATALOGUE,
                    f"label_document_id {keys[2]!r} not in the catalogue",
                )
                continue
            gold_id = MISSING_GOLD
        mention_id, left, surface, right, corpus = mention
        if not seen_mentions.add(mention_id):
            row.reject(policy, BadRowKind.DUPLICATE_KEY, f"duplicate mention_id {mention_id!r}")
            continue
        yield Mention(mention_id, left, surface, right, int(gold_id), corpus)


def _mention(
    row: InputRow, policy: BadRowPolicy, keys: tuple[str, str, str, str], context: str | None
) -> tuple[str, str, str, str, str] | None:
    """(mention_id, left, mention, right, corpus) cut from the context document by the inclusive
    token offsets; None after reporting a bad row."""
    record = row.record
    if context is None:
        row.reject(
            policy, BadRowKind.MISSING_FIELD, f"context document {keys[1]!r} not in documents/"
        )
        return None
    if isinstance(record.get("text"), str) and not record["text"].strip():
        row.reject(policy, BadRowKind.EMPTY_TEXT, f"mention {keys[0]!r} has empty text")
        return None
    tokens = context.split()
    start, end = record["start_index"], record["end_index"]
    if not (type(start) is int and type(end) is int and 0 <= start <= end < len(tokens)):
        row.reject(
            policy,
            BadRowKind.OFFSETS_OUTSIDE_CONTEXT,
            f"tokens [{start}, {end}] outside a context of {len(tokens)} tokens",
        )
        return None
    return (
        keys[0],
        " ".join(tokens[:start]),
        " ".join(tokens[start : end + 1]),
        " ".join(tokens[end + 1 :]),
        keys[3],
    )
