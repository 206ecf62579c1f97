"""Bad input rows (DESIGN.md §9): strict by default, or skipped with a count and a rejects file.

Every converter reads its input through :func:`iter_json_lines` and reports each bad row to one
:class:`BadRowPolicy`. In ``strict`` mode (the default) the first bad row raises
:class:`BadRowError`, whose message names the file and 1-based line. In ``skip`` mode the row is
counted under its :class:`BadRowKind` and written, with its file, line and reason, as one JSON line
to the rejects file. Nothing is dropped without a count.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Sequence
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal

from encoders.errors import InputError

BadRowMode = Literal["strict", "skip"]
BAD_ROW_MODES: tuple[str, ...] = ("strict", "skip")
REJECTS_FILE = "rejects.jsonl"


class BadRowKind(StrEnum):
    """The kinds of bad input row, each counted separately in skip mode."""

    MALFORMED_JSON = "malformed_json"
    MISSING_FIELD = "missing_field"
    OFFSETS_OUTSIDE_CONTEXT = "offsets_outside_context"
    GOLD_NOT_IN_CATALOGUE = "gold_not_in_catalogue"
    DUPLICATE_KEY = "duplicate_key"
    EMPTY_KEY = "empty_key"
    EMPTY_TEXT = "empty_text"


class BadRowError(InputError):
    """A bad input row in strict mode; the message is ``<file>:<line>: <kind>: <detail>``."""

    def __init__(self, kind: BadRowKind, path: Path, line: int, detail: str) -> None:
        super().__init__(f"{path}:{line}: {kind.value}: {detail} (use --on-bad-row skip to skip)")
        self.kind = kind
        self.path = path
        self.line = line
        self.detail = detail


class BadRowPolicy:
    """Decides what happens to a bad row and keeps the per-kind counts.

    Args:
        mode: ``"strict"`` raises on the first bad row; ``"skip"`` counts it and writes it to
            ``rejects_path``.
        rejects_path: JSON-lines file of rejected rows (skip mode); created on the first reject.
    """

    def __init__(self, mode: BadRowMode = "strict", rejects_path: Path | None = None) -> None:
        if mode not in BAD_ROW_MODES:
            raise ValueError(f"on-bad-row mode must be one of {BAD_ROW_MODES}, got {mode!r}")
        if mode == "skip" and rejects_path is None:
            raise ValueError("skip mode needs a rejects file")
        self.mode = mode
        self.rejects_path = rejects_path
        self.counts: Counter[str] = Counter()
        self._rejects: IO[str] | None = None
        if rejects_path is not None and mode == "skip":
            rejects_path.unlink(missing_ok=True)  # a stale file from an earlier run would mislead

    def reject(self, kind: BadRowKind, path: Path, line: int, raw: str, detail: str) -> None:
        """Report one bad row: raise in strict mode, count and record it in skip mode."""
        if self.mode == "strict":
            raise BadRowError(kind, path, line, detail)
        self.counts[kind.value] += 1
        if self._rejects is None:
            assert self.rejects_path is not None
            self.rejects_path.parent.mkdir(parents=True, exist_ok=True)
            self._rejects = self.rejects_path.open("w", encoding="utf-8")
        record = {
            "kind": kind.value,
            "file": str(path),
            "line": line,
            "detail": detail,
            "row": raw.rstrip("\n"),
        }
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
        if self._rejects is not None:
            self._rejects.close()
            self._rejects = None

    def __enter__(self) -> BadRowPolicy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class JsonRow:
    """One parsed JSON object with where it came from, for error messages and rejects."""

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


def iter_json_lines(path: Path, policy: BadRowPolicy) -> Iterator[JsonRow]:
    """Stream the JSON objects of a JSON-lines file, one line at a time.

    Blank lines are not rows and are passed over; a line that is not a JSON object is reported
    as ``malformed_json``.
    """
    path = Path(path)
    with path.open("r", encoding="utf-8") as handle:
        for line_number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except json.JSONDecodeError as error:
                policy.reject(BadRowKind.MALFORMED_JSON, path, line_number, raw, str(error))
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
            yield JsonRow(path, line_number, raw, record)


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
        help=f"rejects file for --on-bad-row skip (default: <out>/{REJECTS_FILE})",
    )


def policy_from_arguments(mode: str, rejects: Path | None, out: Path) -> BadRowPolicy:
    """Build the policy of a ``hnce data`` command from its parsed options."""
    return BadRowPolicy(mode, rejects or Path(out) / REJECTS_FILE)  # type: ignore[arg-type]


def iter_json_chunks(path: Path, policy: BadRowPolicy, size: int) -> Iterator[list[JsonRow]]:
    """:func:`iter_json_lines` in lists of up to ``size`` rows, for vectorised gold look-ups."""
    chunk: list[JsonRow] = []
    for row in iter_json_lines(path, policy):
        chunk.append(row)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
