"""Atomic publication of versioned directories, shared by the index and negatives stores (DESIGN.md §2).

A version is built in a hidden `.building-v<N>/` directory, renamed to `v<N>/` when complete (a
rename is atomic on one file system), and then named live by `CURRENT`, which is replaced by
writing a temporary file, fsyncing it and renaming it over the old one. A reader that follows
`CURRENT` therefore only ever sees complete versions.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

VERSION_PATTERN = re.compile(r"^v(\d+)$")
BUILDING_PATTERN = re.compile(r"^\.building-v(\d+)$")
CURRENT_FILE = "CURRENT"


def fsync_directory(directory: Path) -> None:
    """Flush a directory entry (a rename or a new file) to disk."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def atomic_write_bytes(path: Path, payload: bytes) -> None:
    """Replace `path` with `payload` atomically: temp file in the same directory, fsync, rename."""
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(temporary, "wb") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    fsync_directory(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    """`atomic_write_bytes` for UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"))


def sha256_file(path: Path, chunk_bytes: int = 1 << 22) -> str:
    """Hex SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def version_dir_name(version: int) -> str:
    return f"v{version}"


def building_dir_name(version: int) -> str:
    return f".building-v{version}"


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
    """The live version named by `root/CURRENT`, or None before the first publication."""
    path = root / CURRENT_FILE
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    match = VERSION_PATTERN.match(text)
    if not match:
        raise ValueError(f"{path}:1: expected a version name like 'v3', got {text!r}")
    return int(match.group(1))


def next_version(root: Path) -> int:
    """One more than any version published, live or being built under `root`."""
    seen = published_versions(root) + building_versions(root) + [read_current(root) or 0]
    return max(seen) + 1


def publish_version(root: Path, version: int, keep: int) -> list[int]:
    """Rename `.building-v<N>` to `v<N>`, point CURRENT at it, drop versions beyond the last `keep`.

    Returns the versions removed. The live version is never removed.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    building = root / building_dir_name(version)
    final = root / version_dir_name(version)
    if final.exists():
        raise FileExistsError(f"{final} already exists; versions are never overwritten")
    os.rename(building, final)
    fsync_directory(root)
    atomic_write_text(root / CURRENT_FILE, version_dir_name(version) + "\n")
    removed = [old for old in published_versions(root)[:-keep] if old != version]
    for old in removed:
        shutil.rmtree(root / version_dir_name(old))
    return removed


def confined_path(base: Path, name: str, source: Path) -> Path:
    """`base / name`, refusing names that leave `base` (absolute, `..`, or symlinks out of it).

    `source` is the file the name came from (named in the error).
    """
    if not name or Path(name).is_absolute() or Path(name).name != name:
        raise ValueError(f"{source}: path {name!r} must be a plain file name inside {base}")
    path = base / name
    if not path.resolve().is_relative_to(base.resolve()):
        raise ValueError(f"{source}: path {name!r} resolves outside {base}")
    return path
