"""The one way hnce writes a file that readers may see: a temporary sibling, published by rename.

Every store, checkpoint, dataset and report goes through :class:`AtomicPath` (or the small
``atomic_write_*`` wrappers around it), under one rule: write the temporary file, ``fsync`` it,
``rename`` it over the target, ``fsync`` the directory. A reader therefore sees the old file or the
whole new one, and a crash never leaves a half-written file under the target's name. Directories
(datasets, token stores, index and negatives versions, exported models) are built in a hidden
staging sibling (:func:`staging_directory`, named ``.building-<name>-…``) and published by
:func:`publish_directory`: a rename of the complete directory followed by an ``fsync`` of its
parent.

Example::

    with AtomicPath(shard_path) as temporary:
        faiss.write_index(index, str(temporary))      # renamed over shard_path on success

    atomic_write_json(run_dir / "status.json", {"step": 10})
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

from hnce.errors import InputError, naming_refused_writes, refused_write

logger = logging.getLogger(__name__)

_TEMPORARY_PREFIX = ".tmp-"
#: Every directory being built starts with this (and is never read as a published one).
STAGING_PREFIX = ".building-"
#: A resumable build's record of what it has finished, inside its staging directory.
PROGRESS_FILE = "progress.json"


def fsync_directory(directory: Path) -> None:
    """Flush a directory entry (a rename or a new file) to disk."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def fsync_file(path: Path) -> None:
    """Flush a file's contents to disk."""
    with open(path, "rb+") as handle:
        os.fsync(handle.fileno())


class AtomicPath:
    """A temporary sibling of ``target`` that becomes ``target`` on :meth:`commit`.

    Use as a context manager (commit on success, :meth:`abort` on an exception) or call
    ``commit``/``abort`` yourself when the file is written over many calls (a Parquet writer).
    The temporary name is unique per process and object, so concurrent writers never share one.
    A write or fsync the machine refuses (a full disk) is raised naming the target: Python's own
    errors of a write name no file.
    """

    def __init__(self, target: Path) -> None:
        self.target = Path(target)
        if self.target.is_dir():  # refused before anything is written beside it
            raise InputError(f"{self.target}: is a directory; name a file to write")
        self.target.parent.mkdir(parents=True, exist_ok=True)
        token = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.temporary = self.target.with_name(f"{_TEMPORARY_PREFIX}{token}-{self.target.name}")

    def commit(self) -> Path:
        """fsync the temporary file, rename it over the target, fsync the directory; a commit
        that fails (a full disk, a directory made at the target meanwhile) removes the
        temporary file before the error goes on, naming the target."""
        try:
            with naming_refused_writes(self.target):
                fsync_file(self.temporary)
                os.replace(self.temporary, self.target)
                fsync_directory(self.target.parent)
        except BaseException:
            self.abort()
            raise
        return self.target

    def abort(self) -> None:
        """Remove the temporary file; the target is untouched."""
        self.temporary.unlink(missing_ok=True)

    def __enter__(self) -> Path:
        return self.temporary

    def __exit__(self, _: object, error: BaseException | None, *__: object) -> None:
        """Commit, or remove the temporary file; a write the machine refused in the block is
        raised naming the target (:func:`hnce.errors.refused_write`)."""
        if error is None:
            self.commit()
            return
        self.abort()
        named = refused_write(error, self.target)
        if named is not None:
            raise named from error


class ClosedOnExit(ABC):
    """Mixin: a ``with`` block over the object calls its ``close()`` on leaving (a writer)."""

    @abstractmethod
    def close(self) -> None:
        """Finish what the object writes; called once more is harmless."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def atomic_link(source: Path, target: Path) -> Path:
    """``target`` as a hard link to ``source`` (a copy where the two are on different file
    systems), published atomically: another version's file taken over without rewriting it."""
    with AtomicPath(target) as temporary:
        try:
            os.link(source, temporary)
        except OSError:
            shutil.copyfile(source, temporary)
    return target


def atomic_write_bytes(path: Path, payload: bytes) -> Path:
    """Replace ``path`` with ``payload`` atomically."""
    with AtomicPath(path) as temporary:
        temporary.write_bytes(payload)
    return Path(path)


def atomic_write_text(path: Path, text: str) -> Path:
    """Replace ``path`` with UTF-8 ``text`` atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, payload: Any) -> Path:
    """Replace ``path`` with ``payload`` as indented JSON atomically."""
    return atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=True) + "\n")


@contextmanager
def directory_lock(directory: Path) -> Iterator[None]:
    """An exclusive lock on ``directory`` itself (``flock`` on its descriptor: no lock file is
    left beside what is published), held for the block; released when the process dies."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


def publish_directory(building: Path, final: Path) -> Path:
    """Rename the complete directory ``building`` to ``final`` (which must not exist) and fsync
    the parent: the directory appears whole or not at all. A rename or fsync the machine refuses
    is raised naming ``final``."""
    if final.exists():
        raise FileExistsError(f"{final} already exists; a published directory is never overwritten")
    with naming_refused_writes(final):
        os.rename(building, final)
        fsync_directory(final.parent)
    return final


def staging_directory(final: Path) -> Path:
    """A new, empty hidden sibling of ``final`` to build it in, unique to this process and call:
    ``.building-<final name>-<pid>-<token>``. Staging siblings of ``final`` left by a process
    of this host that died (SIGKILL, power loss) are removed first (:func:`remove_leftovers`)."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(final)
    token = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    building = final.parent / f"{STAGING_PREFIX}{final.name}-{token}"
    building.mkdir()
    return building


def remove_leftovers(final: Path) -> list[Path]:
    """Remove the staging siblings of ``final`` whose builder is gone (its pid no longer runs on
    this host); returns them. A builder on another host of a shared filesystem cannot be asked,
    so only this host's pids are judged; a live builder's directory is never touched."""
    pattern = re.compile(rf"^{re.escape(STAGING_PREFIX + final.name)}-(\d+)-[0-9a-f]{{8}}$")
    removed = []
    for entry in final.parent.iterdir() if final.parent.is_dir() else ():
        match = pattern.match(entry.name)
        if match and not _running(int(match.group(1))):
            logger.warning("%s: removing what a %s that died left behind", entry, "build")
            remove_owned(entry, final.parent)
            removed.append(entry)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_owned(path: Path, owner: Path) -> None:
    """Delete ``path`` (a file or a directory tree) that the directory ``owner`` owns.

    The one way hnce deletes: a path that does not lie inside ``owner`` once resolved is refused
    (``OutsideOwner``), and a symlink is removed as a link, never followed, so a link planted in
    a run or store directory can never make hnce delete what it points to."""
    path, owner = Path(path), Path(owner)
    if not path.absolute().is_relative_to(owner.absolute()):
        raise OutsideOwner(f"{path}: refusing to delete, it is not inside {owner}")
    if path.is_symlink():
        path.unlink()
        return
    if not path.exists():
        return
    if not path.resolve().is_relative_to(owner.resolve()):
        raise OutsideOwner(f"{path}: refusing to delete, it resolves outside {owner}")
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()


class OutsideOwner(PermissionError):
    """A deletion that would reach outside the directory that owns the path."""


@contextmanager
def staging(final: Path) -> Iterator[Path]:
    """:func:`staging_directory` of ``final`` for the block; whatever is left of it (everything,
    unless the block published it by :func:`publish_directory`) is removed on leaving."""
    building = staging_directory(final)
    try:
        yield building
    finally:
        remove_owned(building, building.parent)


def sha256_file(path: Path, chunk_bytes: int = 1 << 22) -> str:
    """Hex SHA-256 of a file, streamed in chunks (never the whole file in memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()
