"""Published checkpoints ``<run>/checkpoints/step-<S>/`` (DESIGN.md §2, §5).

A checkpoint holds the DeepSpeed state (``deepspeed/``, to resume), the Hugging Face export
(``export/``, read by the refresh coordinator and by ``hnce eval``), ``training_state.json``
and, written last, the ``COMPLETE`` marker: a directory without it is never read.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

COMPLETE = "COMPLETE"
DEEPSPEED_DIR = "deepspeed"
DEEPSPEED_TAG = "state"
EXPORT_DIR = "export"
STATE_FILE = "training_state.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def checkpoints_root(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return checkpoints_root(run_dir) / f"step-{step}"


def complete_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, directory) of every checkpoint with its ``COMPLETE`` marker, oldest first."""
    root = checkpoints_root(run_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / COMPLETE).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def newest_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    """The newest complete checkpoint, or None before the first one is published."""
    found = complete_checkpoints(run_dir)
    return found[-1] if found else None


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Write, fsync and rename, so a reader sees the old file or the whole new one."""
    temporary = path.with_name(f".{path.name}.tmp")
    with temporary.open("w") as handle:
        json.dump(payload, handle, indent=2)
        handle.flush()
        os.fsync(handle.fileno())
    temporary.replace(path)


def mark_complete(directory: Path, state: dict[str, Any]) -> None:
    """Write ``training_state.json`` then the ``COMPLETE`` marker (last, atomically)."""
    write_json_atomic(directory / STATE_FILE, state)
    write_json_atomic(directory / COMPLETE, {"step": state["step"]})


def read_state(directory: Path) -> dict[str, Any]:
    return json.loads((directory / STATE_FILE).read_text())


def prune_checkpoints(run_dir: Path, keep: int, protect: set[int] | None = None) -> list[int]:
    """Delete all but the newest ``keep`` complete checkpoints, never those in ``protect``
    (e.g. the step the current negatives were mined from, which a refresh may still read)."""
    protect = protect or set()
    complete = complete_checkpoints(run_dir)
    removed = []
    for step, directory in complete[:-keep] if keep > 0 else complete:
        if step in protect:
            continue
        # Drop the marker first, so a concurrent reader never sees a complete, half-deleted one.
        (directory / COMPLETE).unlink(missing_ok=True)
        shutil.rmtree(directory, ignore_errors=True)
        removed.append(step)
    return removed
