"""Zeshel (zero-shot entity linking, Logeswaran et al. 2019) to the Parquet contracts.

Input (DESIGN.md §6)::

    documents/<world>.json   lines {document_id, title, text}
    mentions/<split>.json    lines {mention_id, context_document_id, corpus, start_index,
                                    end_index, text, label_document_id, category}

``start_index`` / ``end_index`` are *inclusive* positions of whitespace tokens in the context
document's text; the mention is ``tokens[start:end + 1]``, the left context the tokens before it
and the right context the tokens after it (whole document, the encoder truncates around the
mention). One domain per world; ``val`` becomes the ``dev`` split.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
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


def convert_zeshel(
    zeshel_dir: Path,
    out: Path,
    policy: BadRowPolicy | None = None,
    keep_missing_gold: bool = False,
    chunk_size: int = 10_000,
) -> dict[str, Any]:
    """Convert a Zeshel directory into the dataset directory ``out``; return the summary.

    Args:
        zeshel_dir: holds ``documents/`` and ``mentions/``.
        out: dataset directory to write (``entities/``, ``mentions/``, ``summary.json``).
        policy: what to do with bad rows (strict by default).
        keep_missing_gold: keep mentions whose label document is not in the catalogue with
            ``gold = MISSING_GOLD`` (counted, for evaluation that must score them as errors)
            instead of treating them as bad rows.
        chunk_size: mentions resolved together (bounds memory: their context documents).
    """
    zeshel_dir, out = Path(zeshel_dir), Path(out)
    policy = policy or BadRowPolicy()
    document_files = sorted((zeshel_dir / "documents").glob("*.json"))
    mention_files = sorted((zeshel_dir / "mentions").glob("*.json"))
    if not document_files:
        raise FileNotFoundError(f"no Zeshel documents/*.json under {zeshel_dir}")
    entities_per_domain = _write_documents(document_files, out, policy)
    catalogue = EntityCatalogue.open(out)
    mention_counts: dict[str, int] = {}
    missing_kept = 0
    seen_mentions: set[str] = set()
    for path in mention_files:
        split = SPLIT_NAMES.get(path.stem, path.stem)
        with MentionWriter(out, split) as writer:
            for chunk in iter_json_chunks(path, policy, chunk_size):
                for mention in _resolve_chunk(
                    chunk, catalogue, policy, keep_missing_gold, seen_mentions
                ):
                    missing_kept += mention.gold == MISSING_GOLD
                    writer.write(mention)
        mention_counts[split] = mention_counts.get(split, 0) + writer.count
    summary = {
        "format": "zeshel",
        "source": str(zeshel_dir),
        "entities": len(catalogue),
        "entities_per_domain": dict(sorted(entities_per_domain.items())),
        "mentions": mention_counts,
        "missing_gold_kept": missing_kept,
        "bad_rows": policy.summary(),
    }
    write_summary(out, summary)
    return summary


def _write_documents(files: list[Path], out: Path, policy: BadRowPolicy) -> Counter[str]:
    per_domain: Counter[str] = Counter()
    seen: set[str] = set()
    with EntityCatalogueWriter(out) as writer:
        for path in files:
            world = path.stem
            for row in tqdm(iter_json_lines(path, policy), desc=f"zeshel {world}", leave=False):
                if not row.require(policy, DOCUMENT_FIELDS):
                    continue
                key = str(row.record["document_id"])
                text = str(row.record["text"])
                if not key.strip():
                    row.reject(policy, BadRowKind.EMPTY_KEY, "empty document_id")
                elif key in seen:
                    row.reject(policy, BadRowKind.DUPLICATE_KEY, f"duplicate document_id {key!r}")
                elif not text.strip():
                    row.reject(policy, BadRowKind.EMPTY_TEXT, f"document {key!r} has empty text")
                else:
                    seen.add(key)
                    writer.write(Entity(writer.count, key, str(row.record["title"]), text, world))
                    per_domain[world] += 1
    return per_domain


def _resolve_chunk(
    chunk: list[JsonRow],
    catalogue: EntityCatalogue,
    policy: BadRowPolicy,
    keep_missing_gold: bool,
    seen_mentions: set[str],
) -> Iterator[Mention]:
    rows = [row for row in chunk if row.require(policy, MENTION_FIELDS)]
    context_ids = catalogue.ids_for_keys([str(r.record["context_document_id"]) for r in rows])
    gold_ids = catalogue.ids_for_keys([str(r.record["label_document_id"]) for r in rows])
    wanted = sorted({int(i) for i in context_ids if i >= 0})
    context_text = {e.entity_id: e.text for e in catalogue.get_many(wanted)}
    for row, context_id, gold_id in zip(rows, context_ids, gold_ids, strict=True):
        record = row.record
        mention_id = str(record["mention_id"])
        if mention_id in seen_mentions:
            row.reject(policy, BadRowKind.DUPLICATE_KEY, f"duplicate mention_id {mention_id!r}")
            continue
        if context_id < 0:
            row.reject(
                policy,
                BadRowKind.MISSING_FIELD,
                f"context document {record['context_document_id']!r} not in documents/",
            )
            continue
        if "text" in record and not str(record["text"]).strip():
            row.reject(policy, BadRowKind.EMPTY_TEXT, f"mention {mention_id!r} has empty text")
            continue
        tokens = context_text[int(context_id)].split()
        start, end = record["start_index"], record["end_index"]
        if not (
            isinstance(start, int) and isinstance(end, int) and 0 <= start <= end < len(tokens)
        ):
            row.reject(
                policy,
                BadRowKind.OFFSETS_OUTSIDE_CONTEXT,
                f"tokens [{start}, {end}] outside a context of {len(tokens)} tokens",
            )
            continue
        if gold_id < 0:
            if not keep_missing_gold:
                row.reject(
                    policy,
                    BadRowKind.GOLD_NOT_IN_CATALOGUE,
                    f"label_document_id {record['label_document_id']!r} not in the catalogue",
                )
                continue
            gold_id = MISSING_GOLD
        seen_mentions.add(mention_id)
        yield Mention(
            mention_id=mention_id,
            context_left=" ".join(tokens[:start]),
            mention=" ".join(tokens[start : end + 1]),
            context_right=" ".join(tokens[end + 1 :]),
            gold=int(gold_id),
            domain=str(record["corpus"]),
        )
