"""Text at the edges: the one decoding rule for every byte a command reads as text.

Files (recipes, converters' inputs, ``hnce link --kilt/--blink``), stdin and command-line
arguments are UTF-8, decoded strictly where they enter, once. A byte that is not UTF-8 is an
:class:`InputError` naming where it is (``FILE:LINE``, ``stdin line N``, ``argument N``) and its
position in that line, never a ``UnicodeDecodeError`` later, in a tokenizer or inside Ray.
Arguments reach Python already decoded, with the bytes that are not UTF-8 kept as lone
surrogates (PEP 383); :func:`argument_text` encodes them back to the bytes the user gave and
applies the same rule.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from hnce.errors import InputError


class NotText(InputError):
    """Bytes that are not UTF-8; ``detail`` says which byte of the line and why, the message
    also where."""

    def __init__(self, where: str, error: UnicodeDecodeError, line_start: int = 0) -> None:
        bad = error.object[error.start : error.end].hex(" ")
        byte = error.start - line_start
        self.detail = f"not UTF-8 text: byte {byte} (0x{bad}): {error.reason}"
        super().__init__(f"{where}: {self.detail}")


def decode_text(raw: bytes, where: str) -> str:
    """``raw`` as UTF-8 text; :class:`NotText` naming ``where`` and the byte otherwise."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise NotText(where, error) from None


def read_text_file(path: Path) -> str:
    """The whole of a text file; a byte that is not UTF-8 is named by line and byte in it."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        line_start = data.rfind(b"\n", 0, error.start) + 1
        raise NotText(f"{path}:{line}", error, line_start) from None


def argument_text(arguments: Sequence[str]) -> list[str]:
    """The command line's arguments, each checked to be UTF-8 (``argument N``, 1-based after
    the program's name)."""
    return [
        decode_text(os.fsencode(argument), f"argument {number}")
        for number, argument in enumerate(arguments, start=1)
    ]


def stdin_lines(stream: BinaryIO | None = None) -> Iterator[tuple[int, str]]:
    """``(1-based line number, line without its newline)`` of stdin's bytes, each decoded by the
    rule (``stdin line N``)."""
    source = sys.stdin.buffer if stream is None else stream
    for number, raw in enumerate(source, start=1):
        yield number, decode_text(raw, f"stdin line {number}").rstrip("\r\n")
