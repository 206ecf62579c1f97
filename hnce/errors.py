"""Errors as hnce reports them: :class:`InputError`, the one base class of errors a user can fix
(bad input, a bad setting, a missing file), and :func:`refused_write`, which names the file of a
write the machine refused (a full disk, a quota, a read-only file system), and
:class:`Terminated`, a command that stopped on SIGTERM.

They live in the package root, below every layer, so that each of them (encoders, mining,
cluster, pipeline) can use them. The ``hnce`` entry point prints an InputError as one line naming
the file (and line) and exits with status 2, a refused write as one line ``<file>: <reason>``
with status 74, a Terminated as one line with status 143; any other exception is a bug of ours
and keeps its traceback.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# How Rust's std::io::Error ends its text, which safetensors and tokenizers raise as a message.
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


class InputError(ValueError):
    """A mistake in what the user gave us; the message names the file, line or setting."""


class Terminated(Exception):
    """SIGTERM: the command stopped where it was (what it publishes is published whole or not at
    all); the message, when there is one, says where the same command resumes."""


def refused_write(error: BaseException, path: Path | str) -> OSError | None:
    """The ``OSError`` of a write of ``path`` that ``error`` is, naming ``path``; None when
    ``error`` is no OS error or already names its file.

    A refused write loses its file on the way up: Python's write, flush and fsync errors name
    none (only ``open``'s do), pyarrow's name none and add their own wording, and the Rust
    writers of safetensors and tokenizers raise a plain exception ending in ``(os error N)``.
    An error naming two files (a copy, a rename) is named again: ``shutil.copyfile`` names the
    source first, which is not the file the disk refused. An error raised while a refused
    write was being handled is that write's (torch's zip writer, closed under a full disk,
    raises a ``RuntimeError`` about its position): the first refusal is the one named.
    """
    code = None
    current: BaseException | None = error
    while current is not None:
        if isinstance(current, OSError):
            if current.filename is not None and current.filename2 is None:
                break  # named already, with all that led to it
            code = current.errno if current.errno is not None else code
        elif match := _RUST_OS_ERROR.search(str(current)):
            code = int(match.group(1))
        current = current.__context__
    return None if code is None else OSError(code, os.strerror(code), str(path))


@contextmanager
def naming_refused_writes(path: Path | str) -> Iterator[None]:
    """A write of ``path`` in the block that the machine refuses is raised as the ``OSError``
    it is, naming ``path`` (:func:`refused_write`); other errors pass unchanged."""
    try:
        yield
    except Exception as error:
        named = refused_write(error, path)
        if named is None:
            raise
        raise named from error
