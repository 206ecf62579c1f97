"""BLINK's entity catalogue ``entity.jsonl`` to the Parquet contracts, and BLINK's mention files
(:func:`read_blink_mentions`, for linking).

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

from hnce.cluster.stores.tables import Entity, Mention
from hnce.pipeline.data.bad_rows import (
    BadRowKind,
    BadRowPolicy,
    InputRow,
    iter_json_chunks,
    iter_json_lines,
)
from hnce.pipeline.data.conversion import Conversion
from hnce.pipeline.data.fields import KeySet, text_field, write_unique_entities
from hnce.progress import progress_bar

DEFAULT_MAX_TEXT_CHARS = 2048
BLINK_FIELDS = ("text", "idx", "title")
BLINK_MENTION_FIELDS = ("context_left", "mention", "context_right")
_CURID = re.compile(r"curid=([0-9]+)")
_CHUNK = 8192


def truncate_text(text: str, max_chars: int) -> str:
    """Cut ``text`` to at most ``max_chars`` characters at a word boundary."""
    text = text.strip()
    if len(text) <= max_chars:
        return text
    cut = text.rfind(" ", 0, max_chars + 1)
    return text[: cut if cut > 0 else max_chars].rstrip()


def _blink_entity(row: InputRow, policy: BadRowPolicy, max_chars: int) -> Entity | None:
    """The entity of one ``entity.jsonl`` line (entity_id assigned when written), or None after
    reporting the bad row."""
    if not row.require(policy, BLINK_FIELDS):
        return None
    fields = []
    for name in BLINK_FIELDS:
        value = text_field(row, policy, name)
        if value is None:  # reported once, for the first field that is not a string
            return None
        fields.append(value)
    text, idx, title = fields
    match = _CURID.search(idx)
    if match is None:
        row.reject(policy, BadRowKind.EMPTY_KEY, f"idx {idx!r} has no curid=")
        return None
    text = truncate_text(text, max_chars)
    if not text:
        row.reject(policy, BadRowKind.EMPTY_TEXT, f"entity curid={match.group(1)} has empty text")
        return None
    return Entity(-1, match.group(1), title, text)


def convert_blink_entities(
    path: Path, conversion: Conversion, max_text_chars: int = DEFAULT_MAX_TEXT_CHARS
) -> dict[str, Any]:
    """Stream ``entity.jsonl`` into the catalogue of ``conversion``; return counts and the
    alignment flag. The key is the curid as written (ASCII digits; ``0100`` stays ``0100``)."""
    policy = conversion.policy
    keys = KeySet()
    rows_read = 0
    consecutive = True  # no blank line between rows: row number = line number
    with conversion.builder.entities() as writer:
        progress = progress_bar(desc="blink entities", unit=" entities")
        for chunk in iter_json_chunks(path, policy, _CHUNK):
            rows_read += len(chunk)
            consecutive &= chunk[-1].line == rows_read
            entities = [
                (row, entity)
                for row in chunk
                if (entity := _blink_entity(row, policy, max_text_chars))
            ]
            write_unique_entities(entities, writer, keys, policy, "curid")
            progress.update(len(chunk))
        progress.close()
    return {
        "source": str(path),
        "entities": writer.count,
        "entity_id_is_blink_row": consecutive and writer.count == rows_read and policy.total == 0,
    }


def read_blink_mentions(path: Path, policy: BadRowPolicy | None = None) -> list[Mention]:
    """Every line of a BLINK mention file (``{context_left, mention, context_right, ...}``, the
    input of BLINK's ``main_dense.py``), gold unknown, its id ``FILE:LINE`` (or its ``id``);
    strict by default: a line without the three strings is an error naming the file and line."""
    policy = policy or BadRowPolicy()
    mentions = []
    for row in iter_json_lines(Path(path), policy):
        if not row.require(policy, BLINK_MENTION_FIELDS):
            continue
        parts = [text_field(row, policy, name) for name in BLINK_MENTION_FIELDS]
        if any(part is None for part in parts):
            continue
        left, mention, right = parts
        mention_id = str(row.record.get("id", f"{path}:{row.line}"))
        mentions.append(Mention(mention_id, left, mention, right, -1))
    return mentions
