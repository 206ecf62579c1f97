"""The JSON documents hnce writes and reads back (manifests, checkpoint states, export
descriptions, progress records), each read against its schema.

Everything hnce reads back lies in directories that users and other machines can write (a run
directory, a dataset, an export), and a checksum over a file says nothing of a manifest that was
re-signed after a hand edit. So every document has one schema (a :func:`document_record` or
another pydantic type, strict: a missing or mistyped key is refused, nothing is coerced), and
:func:`read_document` reads it through that schema: a document cut short, of another shape or
not text is an :class:`InputError` naming the file (and the line, or the key), never a
``JSONDecodeError``, ``KeyError`` or ``TypeError`` where the value is used. It lives in the
package root, below every layer, so the encoders' export descriptions and the stores' manifests
are read the one way.

A record of work that can be done again (a build's progress, a generator's parameters) is read
by :func:`read_resumable` instead: unreadable, it is no record, and the work starts again.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TypeVar

from pydantic import ConfigDict, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass

from hnce.errors import InputError

logger = logging.getLogger(__name__)

Document = TypeVar("Document")


class DocumentMissing(InputError, FileNotFoundError):
    """A document that is not there (a ``FileNotFoundError`` too, for callers that expect
    one)."""


def document_record(cls: type) -> type:
    """A record of a document (a manifest, a shard of one, a checkpoint's state): a frozen
    pydantic dataclass that refuses unknown keys and coerces nothing, so reading the document
    checks it."""
    return dataclass(config=ConfigDict(extra="forbid", strict=True, frozen=True))(cls)


def schema_problems(error: ValidationError) -> str:
    """Each problem of ``error`` as ``key: what`` (dotted keys; ``(top level)`` for the
    document itself), joined by ``; ``."""
    return "; ".join(
        f"{'.'.join(str(part) for part in problem['loc']) or '(top level)'}: {problem['msg']}"
        for problem in error.errors(include_url=False)
    )


def read_document(
    path: Path,
    schema: TypeAdapter[Document],
    what: str,
    error: type[InputError] = InputError,
) -> Document:
    """The JSON document at ``path``, validated against ``schema``.

    Raises ``error`` (an :class:`InputError`) naming the file: with the line for text that is
    not JSON, with the keys for a document that breaks the schema; ``what`` names the document
    in the message (``manifest``, ``export description``). A missing file is a
    :class:`DocumentMissing`, which a caller may word for its own document."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DocumentMissing(f"{path}: missing; no {what}") from None
    except UnicodeDecodeError:
        raise error(f"{path}: not a {what}: not UTF-8 text") from None
    try:
        json.loads(text)
    except json.JSONDecodeError as problem:
        raise error(f"{path}:{problem.lineno}: invalid {what} JSON: {problem.msg}") from None
    try:
        return schema.validate_json(text)
    except ValidationError as problem:
        raise error(f"{path}: not a valid {what}: {schema_problems(problem)}") from None


def read_resumable(path: Path, schema: TypeAdapter[Document], what: str) -> Document | None:
    """The record of resumable work at ``path`` (:func:`read_document`), or None when there is
    none or it is unreadable (logged, naming the file and what is wrong): starting the work
    again is then the only remedy, so it is taken rather than asked of the user."""
    try:
        return read_document(path, schema, what)
    except FileNotFoundError:
        return None
    except InputError as error:
        logger.warning("%s; starting again", error)
        return None
