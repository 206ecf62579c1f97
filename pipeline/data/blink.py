"""BLINK's entity catalogue ``entity.jsonl`` to the Parquet contracts.

Each line is ``{text, idx: "https://en.wikipedia.org/wiki?curid=<id>", title, entity}``; the
Wikipedia page id after ``curid=`` is the entity's ``key`` (so KILT AIDA golds resolve by
``wikipedia_id``), and ``entity_id`` is the row number, which is BLINK's local entity id. Keeping
``entity_id == BLINK row`` is what lets BLINK's precomputed encodings (``all_entities_large.t7``,
one row per line) seed index version 0 without re-encoding; a rejected row would shift every
later id, so the summary records whether the alignment holds (``entity_id_is_blink_row``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tqdm import tqdm

from cluster.tables import Entity, EntityCatalogueWriter
from pipeline.data.bad_rows import BadRowKind, BadRowPolicy, iter_json_lines

DEFAULT_MAX_TEXT_CHARS = 2048
BLINK_FIELDS = ("text", "idx", "title")
_CURID = re.compile(r"curid=(\d+)")


def truncate_text(text: str, max_chars: int) -> str:
    """Cut ``text`` to at most ``max_chars`` characters at a word boundary."""
    text = text.strip()
    if len(text) <= max_chars:
        return text
    cut = text.rfind(" ", 0, max_chars + 1)
    return text[: cut if cut > 0 else max_chars].rstrip()


def convert_blink_entities(
    path: Path,
    out: Path,
    policy: BadRowPolicy,
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS,
) -> dict[str, Any]:
    """Stream ``entity.jsonl`` into ``out/entities/``; return counts and the alignment flag."""
    seen: set[int] = set()
    rows_read = 0
    with EntityCatalogueWriter(out) as writer:
        for row in tqdm(iter_json_lines(path, policy), desc="blink entities", unit=" entities"):
            rows_read += 1
            if not row.require(policy, BLINK_FIELDS):
                continue
            record = row.record
            match = _CURID.search(str(record["idx"]))
            if match is None:
                row.reject(policy, BadRowKind.EMPTY_KEY, f"idx {record['idx']!r} has no curid=")
                continue
            curid = int(match.group(1))
            if curid in seen:
                row.reject(policy, BadRowKind.DUPLICATE_KEY, f"duplicate curid {curid}")
                continue
            text = truncate_text(str(record["text"]), max_text_chars)
            if not text:
                row.reject(policy, BadRowKind.EMPTY_TEXT, f"entity curid={curid} has empty text")
                continue
            seen.add(curid)
            writer.write(Entity(writer.count, str(curid), str(record["title"]), text))
        count = writer.count
    return {
        "source": str(path),
        "entities": count,
        "entity_id_is_blink_row": count == rows_read and policy.total == 0,
    }
