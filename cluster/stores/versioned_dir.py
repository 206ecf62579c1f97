"""Versioned directories shared by the index and negatives stores (docs/stores.md): atomic
publication, and the manifests that make a published version verifiable.

A version is built in a hidden `.building-v<N>/` directory, renamed to `v<N>/` when complete (a
rename is atomic on one file system), and then named live by `CURRENT`, which is replaced through
the one atomic write of `hnce.cluster.stores.files`. A reader that follows `CURRENT` therefore only ever sees
complete versions.

Every version holds a `manifest.json`, written last, that records its version number and the
SHA-256 of each of its files. Readers check a manifest against its schema (pydantic, strict:
a missing or mistyped key is an error naming the file and the key, never a bare KeyError), its
version against the directory's name and each file against its checksum (streamed); every
failure is a :class:`StoreError`, an ``InputError`` naming the file.

Both stores are a :class:`VersionedStore` (the versions under one root, the one that `CURRENT`
names, publication and retention) and read and write their manifests (and the index build's
`progress.json`) through one :class:`ManifestFile` each.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Generic, Protocol, TypeVar

from pydantic import Field, TypeAdapter

from hnce.cluster.stores.files import (
    STAGING_PREFIX,
    atomic_write_text,
    publish_directory,
    remove_owned,
    sha256_file,
)
from hnce.documents import read_document
from hnce.errors import InputError

MANIFEST_FILE = "manifest.json"
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Count = Annotated[int, Field(ge=0)]
Positive = Annotated[int, Field(gt=0)]
Record = TypeVar("Record")
Opened = TypeVar("Opened")


class StoreError(InputError):
    """A store version that does not match its manifest, or a manifest that is malformed."""


class ChecksumError(StoreError):
    """A file does not match the SHA-256 recorded in its version's manifest."""


class VersionMissing(StoreError, FileNotFoundError):
    """A version's manifest or file is gone (e.g. removed by retention while being opened)."""


VERSION_PATTERN = re.compile(r"^v(\d+)$")
BUILDING_PATTERN = re.compile(r"^\.building-v(\d+)$")
CURRENT_FILE = "CURRENT"
#: a version's use stamp (:func:`mark_used`), in stores that keep their most recently used
USED_FILE = "last-used"


def version_dir_name(version: int) -> str:
    return f"v{version}"


def building_dir_name(version: int) -> str:
    """The version's staging directory: named by its number (not by its builder), so a build
    that stopped is resumed by the next one."""
    return f"{STAGING_PREFIX}v{version}"


def published_versions(root: Path) -> list[int]:
    """Version numbers of the complete `v<N>/` directories under `root`, ascending."""
    if not root.is_dir():
        return []
    found = (VERSION_PATTERN.match(entry.name) for entry in root.iterdir() if entry.is_dir())
    return sorted(int(match.group(1)) for match in found if match)


def building_versions(root: Path) -> list[int]:
    """Version numbers of unfinished `.building-v<N>/` directories under `root`, ascending."""
    if not root.is_dir():
        return []
    found = (BUILDING_PATTERN.match(entry.name) for entry in root.iterdir() if entry.is_dir())
    return sorted(int(match.group(1)) for match in found if match)


def read_current(root: Path) -> int | None:
    """The live version named by `root/CURRENT`, or None before the first publication.

    A CURRENT that names no published version is refused naming both: publishing points CURRENT
    at the new version before retention removes old ones, so a version gone under a reader
    (retention) means CURRENT has moved on, and is read again once."""
    for _ in range(2):
        version = _named_version(root)
        if version is None or (root / version_dir_name(version)).is_dir():
            return version
    published = ", ".join(version_dir_name(n) for n in published_versions(root)) or "none"
    raise StoreError(
        f"{root / CURRENT_FILE}:1: names {version_dir_name(version)}, which is not a published "
        f"version of {root} (published: {published})"
    )


def _named_version(root: Path) -> int | None:
    path = root / CURRENT_FILE
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    match = VERSION_PATTERN.match(text)
    if not match:
        raise StoreError(f"{path}:1: expected a version name like 'v3', got {text!r}")
    return int(match.group(1))


def next_version(root: Path) -> int:
    """One more than any version published, live or being built under `root`."""
    seen = published_versions(root) + building_versions(root) + [read_current(root) or 0]
    return max(seen) + 1


def mark_used(directory: Path) -> None:
    """Stamp the version in `directory` as used now (nanoseconds since the epoch), in a file of
    its own replaced atomically: a crash leaves the old stamp or the new one, a concurrent
    reader sees one of them whole, and the stamp goes with the version when it is removed."""
    atomic_write_text(Path(directory) / USED_FILE, f"{time.time_ns()}\n")


def last_used(directory: Path) -> int:
    """When the version in `directory` was last used (:func:`mark_used`); 0 where it never was
    stamped (or its stamp is unreadable), so retention drops it before any stamped one."""
    try:
        return int((Path(directory) / USED_FILE).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return 0


def versions_by_use(root: Path) -> list[int]:
    """The published versions under `root`, least recently used first (ties by number)."""
    return sorted(
        published_versions(root),
        key=lambda version: (last_used(root / version_dir_name(version)), version),
    )


def publish_version(
    root: Path,
    version: int,
    keep: int,
    ranked: Callable[[Path], list[int]] = published_versions,
) -> list[int]:
    """Rename `.building-v<N>` to `v<N>`, point CURRENT at it, drop versions beyond the last `keep`
    of `ranked(root)` (the versions least worth keeping first: by default the oldest).

    Returns the versions removed. The live version is never removed. When CURRENT cannot be
    written (a full disk), `v<N>` is renamed back to `.building-v<N>` before the error goes on:
    the store is left as it was before the publication (docs/failures.md, "Disks that fill").
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    building = root / building_dir_name(version)
    final = publish_directory(building, root / version_dir_name(version))
    try:
        atomic_write_text(root / CURRENT_FILE, version_dir_name(version) + "\n")
    except BaseException:
        if _named_version(root) != version:  # else CURRENT moved, and only its fsync failed
            os.rename(final, building)
        raise
    removed = [old for old in ranked(root)[:-keep] if old != version]
    for old in removed:
        remove_owned(root / version_dir_name(old), root)
    return removed


def confined_path(base: Path, name: str, source: Path) -> Path:
    """`base / name`, refusing names that leave `base` (absolute, `..`, or symlinks out of it).

    `source` is the file the name came from (named in the error).
    """
    if not name or Path(name).is_absolute() or Path(name).name != name:
        raise StoreError(f"{source}: path {name!r} must be a plain file name inside {base}")
    path = base / name
    if not path.resolve().is_relative_to(base.resolve()):
        raise StoreError(f"{source}: path {name!r} resolves outside {base}")
    return path


def read_manifest(path: Path, schema: TypeAdapter[Record]) -> Record:
    """The manifest at ``path`` validated against ``schema`` (:func:`read_document`); StoreError
    naming the file (and the line for invalid JSON, the keys for a schema violation)."""
    try:
        return read_document(path, schema, "manifest", StoreError)
    except FileNotFoundError:
        raise VersionMissing(f"{path}: missing; not a published store version") from None


def check_version(recorded: int, directory: Path, manifest_path: Path) -> None:
    """The version a manifest records must be the one its directory is named after."""
    match = VERSION_PATTERN.match(directory.name) or BUILDING_PATTERN.match(directory.name)
    expected = int(match.group(1)) if match else None
    if recorded != expected:
        raise StoreError(
            f"{manifest_path}: records version {recorded} but lies in {directory.name}/"
        )


def verify_sha256(path: Path, expected: str, manifest_path: Path) -> None:
    """Stream ``path`` through SHA-256 and compare with ``expected`` (from ``manifest_path``)."""
    try:
        actual = sha256_file(path)
    except FileNotFoundError:
        raise VersionMissing(f"{path}: listed in {manifest_path} but missing") from None
    if actual != expected:
        raise ChecksumError(
            f"{path}: sha256 {actual} does not match {expected} recorded in {manifest_path}; "
            f"the file is corrupt"
        )


def created_at() -> str:
    """Now, as a manifest records when its version was written (UTC, ISO 8601)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def manifest_json(record: Any, schema: TypeAdapter[Any]) -> str:
    """``record`` as the indented JSON text of a manifest (what :func:`read_manifest` reads)."""
    return json.dumps(schema.dump_python(record, mode="json"), indent=2) + "\n"


class _Versioned(Protocol):
    version: int


VersionRecord = TypeVar("VersionRecord", bound=_Versioned)


class ManifestFile(Generic[VersionRecord]):
    """The JSON record file `name` of a version's directory, of `schema` (a
    :func:`~hnce.documents.document_record` with a ``version``): read by :meth:`read`, which
    checks it, and written atomically by :meth:`write`, in the one format :func:`manifest_json`
    writes.

    Args:
        schema: the record's type.
        name: ``manifest.json``, or ``progress.json`` for an unfinished build's progress.
        versioned: whether reading also checks the recorded version against the directory's
            name (:func:`check_version`; a build's progress is not checked).
    """

    def __init__(
        self, schema: type[VersionRecord], name: str = MANIFEST_FILE, *, versioned: bool = True
    ) -> None:
        self.adapter: TypeAdapter[VersionRecord] = TypeAdapter(schema)
        self.name = name
        self.versioned = versioned

    def read(self, directory: Path) -> VersionRecord:
        """The record in `directory`, validated (:func:`read_manifest`); StoreError naming the
        file otherwise."""
        path = Path(directory) / self.name
        record = read_manifest(path, self.adapter)
        if self.versioned:
            check_version(record.version, Path(directory), path)
        return record

    def write(self, directory: Path, record: VersionRecord) -> Path:
        """Replace the record in `directory` with `record`, atomically."""
        return atomic_write_text(Path(directory) / self.name, manifest_json(record, self.adapter))


class VersionedStore:
    """The versions under `root` (module docstring): the base of the index and negatives stores.

    Args:
        root: store directory (created when a version is first built).
        keep: versions retained after a publication (the live one always is).
        keep_used: retain the `keep` most recently used versions (each stamped by
            :meth:`mark_used`, and by its publication) instead of the newest: for a store whose
            versions are found by what they hold and used in any order (the evaluation store),
            where the newest is not the one wanted next.
    """

    def __init__(self, root: Path, keep: int = 3, *, keep_used: bool = False) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.root = Path(root)
        self.keep = keep
        self.keep_used = keep_used

    def versions(self) -> list[int]:
        """Published version numbers, ascending."""
        return published_versions(self.root)

    def current_version(self) -> int | None:
        """The live version that `CURRENT` names, or None before the first publication."""
        return read_current(self.root)

    def unfinished_versions(self) -> list[int]:
        """Version numbers of unfinished builds, ascending."""
        return building_versions(self.root)

    def next_version(self) -> int:
        """One more than any version published, live or being built (:func:`next_version`)."""
        return next_version(self.root)

    def version_dir(self, version: int) -> Path:
        return self.root / version_dir_name(version)

    def building_dir(self, version: int) -> Path:
        return self.root / building_dir_name(version)

    def remove_building(self, version: int) -> None:
        """Remove the unfinished build of `version` (callers hold the store's lock)."""
        remove_owned(self.building_dir(version), self.root)

    def publish_build(self, version: int) -> list[int]:
        """Publish the finished build of `version` (:func:`publish_version`); returns the
        versions retention removed. A store keeping its used versions counts the publication
        as a use (the build was asked for to be used)."""
        if not self.keep_used:
            return publish_version(self.root, version, self.keep)
        mark_used(self.building_dir(version))
        return publish_version(self.root, version, self.keep, versions_by_use)

    def mark_used(self, version: int) -> None:
        """Stamp published `version` as used now (:func:`mark_used`), where the store keeps its
        most recently used versions; nothing otherwise."""
        if self.keep_used:
            mark_used(self.version_dir(version))

    def follow_current(
        self, open_version: Callable[[int], Opened], moved: type[Exception]
    ) -> Opened | None:
        """``open_version`` of the live version, or None before the first publication. If
        opening it raises `moved` and `CURRENT` has meanwhile named another version (retention
        removed the one being opened), the new one is opened instead."""
        for _ in range(10):
            version = self.current_version()
            if version is None:
                return None
            try:
                return open_version(version)
            except moved:
                if self.current_version() == version:
                    raise
        raise RuntimeError(f"{self.root}: CURRENT kept moving while opening it")
