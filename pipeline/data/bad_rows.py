"""Bad input rows (docs/failures.md): strict by default, or skipped with a count and a rejects file.

Every converter reads its input through :func:`iter_text_lines` (or :func:`iter_json_lines` on
top of it) and reports each bad row to one :class:`BadRowPolicy`. In ``strict`` mode (the
default) the first bad row raises :class:`BadRowError`, whose message names the file and 1-based
line. In ``skip`` mode the row is counted under its :class:`BadRowKind` and written, with its
file, line and reason, as one JSON line to the rejects file. Nothing is dropped without a count:
a line that is not valid UTF-8 (or a JSON ``\\u`` escape of a lone surrogate, which Parquet cannot
store) is a bad row of its own kind, ``invalid_utf8``, not a crash.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Sequence
from enum import StrEnum
from pathlib import Path
from typing import IO, Any, Literal, TypeVar

from hnce.cluster.stores.files import ClosedOnExit
from hnce.errors import InputError, naming_refused_writes
from hnce.text import NotText, decode_text

T = TypeVar("T")
BadRowMode = Literal["strict", "skip"]
BAD_ROW_MODES: tuple[str, ...] = ("strict", "skip")
#: what a converter's strict mode says after a bad row (the converters' --on-bad-row option)
SKIP_HINT = " (use --on-bad-row skip to skip)"
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class BadRowKind(StrEnum):
    """The kinds of bad input row, each counted separately in skip mode."""

    INVALID_UTF8 = "invalid_utf8"
    MALFORMED_JSON = "malformed_json"
    MISSING_FIELD = "missing_field"
    INVALID_KEY = "invalid_key"
    OFFSETS_OUTSIDE_CONTEXT = "offsets_outside_context"
    GOLD_NOT_IN_CATALOGUE = "gold_not_in_catalogue"
    DUPLICATE_KEY = "duplicate_key"
    EMPTY_KEY = "empty_key"
    EMPTY_TEXT = "empty_text"


class BadRowError(InputError):
    """A bad input row in strict mode; the message is ``<file>:<line>: <kind>: <detail>``, with
    the way to skip such rows where the command has one (``hint``)."""

    def __init__(
        self, kind: BadRowKind, path: Path, line: int, detail: str, hint: str = ""
    ) -> None:
        super().__init__(f"{path}:{line}: {kind.value}: {detail}{hint}")
        self.kind = kind
        self.path = path
        self.line = line
        self.detail = detail


class BadRowPolicy(ClosedOnExit):
    """Decides what happens to a bad row and keeps the per-kind counts.

    Args:
        mode: ``"strict"`` raises on the first bad row; ``"skip"`` counts it and writes it to
            ``rejects_path``.
        rejects_path: JSON-lines file of rejected rows, created (never overwritten: it must not
            exist) on the first reject. Where it may lie is decided by
            :class:`hnce.pipeline.data.conversion.Conversion`.
        skip_kinds: kinds skipped (counted and written to the rejects file) even in strict mode,
            e.g. ``gold_not_in_catalogue`` for the training split of ``finetune-blink``.
        hint: said after a bad row's message in strict mode: how the command skips such rows
            (``hnce data``'s ``--on-bad-row skip``; commands without that option say nothing).
    """

    def __init__(
        self,
        mode: BadRowMode = "strict",
        rejects_path: Path | None = None,
        skip_kinds: Collection[BadRowKind] = (),
        hint: str = "",
    ) -> None:
        if mode not in BAD_ROW_MODES:
            raise ValueError(f"on-bad-row mode must be one of {BAD_ROW_MODES}, got {mode!r}")
        if (mode == "skip" or skip_kinds) and rejects_path is None:
            raise ValueError("skipping bad rows needs a rejects file")
        self.mode = mode
        self.rejects_path = rejects_path
        self.skip_kinds = frozenset(skip_kinds)
        self.hint = hint
        self.counts: Counter[str] = Counter()
        self._rejects: IO[str] | None = None

    def reject(self, kind: BadRowKind, path: Path, line: int, raw: str, detail: str) -> None:
        """Report one bad row: raise in strict mode, count and record it in skip mode."""
        if self.mode == "strict" and kind not in self.skip_kinds:
            raise BadRowError(kind, path, line, detail, self.hint)
        self.counts[kind.value] += 1
        if self._rejects is None:
            assert self.rejects_path is not None
            self.rejects_path.parent.mkdir(parents=True, exist_ok=True)
            self._rejects = self.rejects_path.open("x", encoding="utf-8")
        record = {
            "kind": kind.value,
            "file": str(path),
            "line": line,
            "detail": detail,
            "row": raw.rstrip("\n"),
        }
        with naming_refused_writes(self.rejects_path):
            self._rejects.write(json.dumps(record, ensure_ascii=False) + "\n")

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def summary(self) -> dict[str, Any]:
        """Counts per kind (every kind listed, zeros included) and the rejects file."""
        return {
            "mode": self.mode,
            "rejected": {kind.value: self.counts.get(kind.value, 0) for kind in BadRowKind},
            "rejected_total": self.total,
            "rejects_file": str(self.rejects_path) if self.total else None,
        }

    def close(self) -> None:
        """Close the rejects file, once: a close that failed (a full disk refusing the last
        lines) is not tried again."""
        rejects, self._rejects = self._rejects, None
        if rejects is not None:
            with naming_refused_writes(self.rejects_path):
                rejects.close()


class InputRow:
    """One input line with where it came from, for error messages and rejects; ``record`` is
    its JSON object (empty for formats that are not JSON lines, such as WordNet's)."""

    __slots__ = ("line", "path", "raw", "record")

    def __init__(self, path: Path, line: int, raw: str, record: dict[str, Any]) -> None:
        self.path = path
        self.line = line
        self.raw = raw
        self.record = record

    def reject(self, policy: BadRowPolicy, kind: BadRowKind, detail: str) -> None:
        policy.reject(kind, self.path, self.line, self.raw, detail)

    def require(self, policy: BadRowPolicy, fields: Sequence[str]) -> bool:
        """True when every field is present and not null; otherwise report ``missing_field``."""
        missing = [name for name in fields if self.record.get(name) is None]
        if missing:
            self.reject(policy, BadRowKind.MISSING_FIELD, f"missing field(s) {', '.join(missing)}")
            return False
        return True


def iter_text_lines(path: Path, policy: BadRowPolicy) -> Iterator[tuple[int, str]]:
    """Stream ``(1-based line number, line)`` of a UTF-8 text file; a line that is not valid
    UTF-8 is reported as ``invalid_utf8`` (with the offending bytes escaped in the rejects)."""
    path = Path(path)
    with path.open("rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            try:
                yield line_number, decode_text(raw, f"{path}:{line_number}")
            except NotText as error:
                escaped = raw.decode("utf-8", "backslashreplace")
                policy.reject(BadRowKind.INVALID_UTF8, path, line_number, escaped, error.detail)


def iter_json_lines(path: Path, policy: BadRowPolicy) -> Iterator[InputRow]:
    """Stream the JSON objects of a JSON-lines file, one line at a time.

    Blank lines are not rows and are passed over; a line that is not a JSON object (including
    JSON nested too deeply or with integers too long for Python to parse) is reported as
    ``malformed_json``.
    """
    path = Path(path)
    for line_number, raw in iter_text_lines(path, policy):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except (ValueError, RecursionError) as error:
            detail = str(error) or type(error).__name__
            policy.reject(BadRowKind.MALFORMED_JSON, path, line_number, raw, detail)
            continue
        if not isinstance(record, dict):
            policy.reject(
                BadRowKind.MALFORMED_JSON,
                path,
                line_number,
                raw,
                f"expected a JSON object, got {type(record).__name__}",
            )
            continue
        if _SURROGATE_ESCAPE.search(raw) and not _is_unicode(record):
            detail = "a \\u escape names a lone surrogate, which is not Unicode text"
            policy.reject(BadRowKind.INVALID_UTF8, path, line_number, raw, detail)
            continue
        yield InputRow(path, line_number, raw, record)


def _is_unicode(record: dict[str, Any]) -> bool:
    """False when a string of ``record`` holds a lone surrogate (valid JSON, not valid text)."""
    try:
        json.dumps(record, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def add_bad_row_arguments(parser: Any) -> None:
    """The ``--on-bad-row`` and ``--rejects`` options shared by every ``hnce data`` command."""
    parser.add_argument(
        "--on-bad-row",
        choices=BAD_ROW_MODES,
        default="strict",
        help="strict (default): stop at the first bad row naming file and line; "
        "skip: count each kind of bad row and write it to the rejects file",
    )
    parser.add_argument(
        "--rejects",
        type=Path,
        default=None,
        help="rejects file for --on-bad-row skip: a new file that is not one of the inputs "
        "(default: rejects.jsonl inside the published dataset)",
    )


def chunked(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """``items`` in lists of up to ``size``, for work done a chunk at a time."""
    chunk: list[T] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def iter_json_chunks(path: Path, policy: BadRowPolicy, size: int) -> Iterator[list[InputRow]]:
    """:func:`iter_json_lines` in lists of up to ``size`` rows, for vectorised look-ups."""
    return chunked(iter_json_lines(path, policy), size)
