"""Append-only JSON-lines logs that a crash mid-write cannot break (the run's event log and its
refresh log; docs/stores.md).

A writer killed while appending can leave a last line without its newline. Readers never trust
such a line (:func:`read_jsonl` leaves it for later: it may still be being written), and the next
append repairs the file first (:func:`append_jsonl` cuts it off, logging what it dropped), so
later records never run onto it. A complete line that is not a JSON object is reported with its
file and line, and skipped: one bad record never makes a whole log unreadable. Lines are strict
JSON: a NaN or infinite number (a diverged loss) is written as null.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hnce.errors import naming_refused_writes

logger = logging.getLogger(__name__)


@dataclass
class JsonLines:
    """What :func:`read_jsonl` found: the records and the line of each, problems (``file:line:
    what``), and the byte offset and line number to read on from."""

    records: list[dict[str, Any]] = field(default_factory=list)
    record_lines: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    offset: int = 0
    line: int = 1


def append_jsonl(path: Path, record: dict[str, Any], durable: bool = False) -> None:
    """Append ``record`` as one line of ``path`` (one writer at a time); ``durable``: fsync.

    A torn last line left by a writer that died is cut off first (logged as a warning). A write
    the machine refuses (a full disk) is cut off too, so the log ends as it did, and raised as
    the ``OSError`` naming ``path`` (:func:`hnce.errors.naming_refused_writes`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(finite_json(record), allow_nan=False) + "\n").encode("utf-8")
    with naming_refused_writes(path), path.open("ab+", buffering=0) as handle:
        _repair_torn_end(path, handle)
        end = handle.tell()
        try:
            written = 0
            while written < len(line):  # unbuffered: a write may take part of the line
                written += handle.write(line[written:])
            if durable:
                os.fsync(handle.fileno())
        except OSError:
            with contextlib.suppress(OSError):  # else the next append cuts the torn line off
                handle.truncate(end)
            raise


def finite_json(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None (strict JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_json(item) for item in value]
    return value


def _repair_torn_end(path: Path, handle: Any) -> None:
    size = handle.seek(0, os.SEEK_END)
    if size == 0:
        return
    handle.seek(size - 1)
    if handle.read(1) == b"\n":
        return
    start = max(0, size - (1 << 20))
    handle.seek(start)
    tail = handle.read()
    keep = start + tail.rfind(b"\n") + 1 if b"\n" in tail else 0
    logger.warning(
        "%s: dropping a torn last line of %d bytes (a writer died while appending it)",
        path,
        size - keep,
    )
    handle.truncate(keep)
    handle.seek(keep)


def read_jsonl(path: Path, offset: int = 0, line: int | None = None) -> JsonLines:
    """The complete lines of ``path`` from byte ``offset``: JSON objects as records, anything
    else as a problem naming its line. A last line without its newline is left unread.

    ``line``: the number of the line at ``offset`` (a previous read's ``line``), so following a
    growing log reads only what was appended; without it the lines before are counted."""
    try:
        with path.open("rb") as handle:
            if line is None:
                line = handle.read(offset).count(b"\n") + 1 if offset else 1
            handle.seek(offset)
            data = handle.read()
    except FileNotFoundError:
        return JsonLines(offset=offset, line=line or 1)
    complete = data[: data.rfind(b"\n") + 1]
    lines = complete.split(b"\n")[:-1]
    found = JsonLines(offset=offset + len(complete), line=line + len(lines))
    for number, raw in enumerate(lines, line):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            found.problems.append(f"{path}:{number}: not a JSON record ({error})")
            continue
        if not isinstance(record, dict):
            found.problems.append(f"{path}:{number}: not a JSON object")
            continue
        found.records.append(record)
        found.record_lines.append(number)
    return found
