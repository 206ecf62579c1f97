"""Atomic publication of versioned directories, shared by the index and negatives stores (DESIGN.md §2).

A version is built in a hidden `.building-v<N>/` directory, renamed to `v<N>/` when complete (a
rename is atomic on one file system), and then named live by `CURRENT`, which is replaced through
the one atomic write of `cluster.files`. A reader that follows `CURRENT` therefore only ever sees
complete versions.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from cluster.files import atomic_write_text, publish_directory

VERSION_PATTERN = re.compile(r"^v(\d+)$")
BUILDING_PATTERN = re.compile(r"^\.building-v(\d+)$")
CURRENT_FILE = "CURRENT"


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
    publish_directory(root / building_dir_name(version), root / version_dir_name(version))
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
