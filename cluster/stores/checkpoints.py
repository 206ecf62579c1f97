"""The layout of a run's checkpoints ``<run>/checkpoints/step-<S>/`` (docs/stores.md, docs/refresh.md).

This module is the only place that knows it; the trainer writes checkpoints through it and the
refresh coordinator, ``hnce eval`` and ``hnce status`` read them through it. A checkpoint holds::

    step-<S>/deepspeed/            DeepSpeed state, to resume training
    step-<S>/export/               the towers (save_pretrained) + scorer.json: what a refresh encodes
    step-<S>/training_state.json   step, seed, negatives version in use, whether it asks for a
                                   refresh (``refresh``; absent: it does)
    step-<S>/COMPLETE              written last: {"step", "files": {relative path: sha256}}

A checkpoint is *complete* when its ``COMPLETE`` marker exists (it is written after every other
file, atomically). The marker is also the checkpoint's manifest: :func:`verify_checkpoint` checks
every file against the SHA-256 recorded there and refuses files that are not listed, and every
loader calls it before reading anything, so a file swapped into a run directory on shared storage
is refused instead of loaded (the trust boundary of ``run.dir``: docs/failures.md, "Trust").

Only the newest checkpoint's DeepSpeed state is needed, to resume; with
``training.keep_deepspeed_state: newest`` the trainer drops it from the older ones
(:func:`slim_checkpoints`), which keep their export. The manifest is re-signed first, atomically,
with the state's files moved from ``files`` to ``dropped``, then they are deleted: a crash in
between leaves files that ``dropped`` lists with their SHA-256, which verify (nothing loads them)
and the next slimming deletes.
"""

from __future__ import annotations

import re
from dataclasses import asdict, field, replace
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from hnce.cluster.stores.files import atomic_write_json, remove_owned, sha256_file
from hnce.cluster.stores.lock_holder import encoding_checkpoint
from hnce.cluster.stores.versioned_dir import Sha256
from hnce.documents import document_record, read_document
from hnce.errors import InputError

CHECKPOINTS_DIR = "checkpoints"
COMPLETE = "COMPLETE"
DEEPSPEED_DIR = "deepspeed"
DEEPSPEED_TAG = "state"
EXPORT_DIR = "export"
#: the rows of the trainer's negative cache a checkpoint keeps, inside its DEEPSPEED_DIR (dropped
#: with it: only the newest resumable checkpoint needs them)
NEGATIVE_CACHE_FILE = "negative_cache.safetensors"
STATE_FILE = "training_state.json"
REFRESH_REQUEST = "refresh"
#: ``training_state.json``: the trainer's word that no refresh started from here on can publish
#: before its last step (``hnce.cluster.compute.refresh.modes.asynchronous``)
REFRESHES_END = "refreshes_end"
#: ``training_state.json``: when the trainer expects its last step (seconds since the epoch), from
#: the mean step so far; absent before a step was timed or without an asynchronous refresh
TRAINING_ENDS_AT = "training_ends_at"
_STEP_DIR = re.compile(r"^step-(\d+)$")


class CheckpointIntegrityError(InputError):
    """A checkpoint file differs from its manifest, is missing, or is not listed in it."""


@document_record
class CheckpointState:
    """``training_state.json``: what the trainer recorded with the checkpoint (read against this
    schema, so a state edited by hand is named, not crashed on by the refresh coordinator or
    ``hnce status``). Every key but ``step`` is absent from checkpoints written before it
    existed (and from checkpoints written outside the trainer)."""

    step: int
    task: str | None = None
    seed: int | None = None
    negatives_version: int | None = None
    loss: float | None = None
    refresh: bool = True
    refreshes_end: bool = False
    training_ends_at: float | None = None


@document_record
class CheckpointManifest:
    """``COMPLETE``: the checkpoint's step and the SHA-256 of each of its files (by path
    relative to the checkpoint directory)."""

    step: int
    files: dict[str, Sha256]
    dropped: dict[str, Sha256] = field(default_factory=dict)  # its DeepSpeed state, once slimmed


_STATE = TypeAdapter(CheckpointState)
_MANIFEST = TypeAdapter(CheckpointManifest)


def checkpoints_root(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINTS_DIR


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return checkpoints_root(run_dir) / f"step-{step}"


def checkpoint_step(directory: Path) -> int:
    """The step of a ``step-<S>`` directory (ValueError for any other name)."""
    match = _STEP_DIR.match(Path(directory).name)
    if not match:
        raise ValueError(f"{directory}: not a checkpoint directory (expected step-<S>)")
    return int(match.group(1))


def is_complete(directory: Path) -> bool:
    """True when ``directory`` holds its ``COMPLETE`` marker and its export."""
    return (directory / COMPLETE).is_file() and (directory / EXPORT_DIR).is_dir()


def _step_directories(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, directory) of every ``step-<S>/`` directory, complete or not, oldest first."""
    root = checkpoints_root(run_dir)
    if not root.is_dir():
        return []
    found = ((_STEP_DIR.match(child.name), child) for child in root.iterdir())
    return sorted(
        (int(match.group(1)), child) for match, child in found if match and child.is_dir()
    )


def complete_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, directory) of every complete checkpoint, oldest first."""
    return [(step, child) for step, child in _step_directories(run_dir) if is_complete(child)]


def newest_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    """The newest complete checkpoint, or None before the first one is published."""
    found = complete_checkpoints(run_dir)
    return found[-1] if found else None


def read_state(directory: Path) -> CheckpointState:
    """A complete checkpoint's ``training_state.json``, validated; a
    :class:`CheckpointIntegrityError` naming the file otherwise."""
    path = Path(directory) / STATE_FILE
    try:
        return read_document(path, _STATE, "checkpoint state", CheckpointIntegrityError)
    except FileNotFoundError:
        raise CheckpointIntegrityError(f"{path}: missing from a complete checkpoint") from None


def wants_refresh(directory: Path) -> bool:
    """Whether a complete checkpoint asks the training run's refresh coordinator to refresh it
    (``training_state.json``'s ``refresh``, the trigger's answer; checkpoints written before the
    key existed ask)."""
    return read_state(directory).refresh


def ends_refreshes(directory: Path) -> bool:
    """Whether a complete checkpoint says no refresh started from it on would publish before its
    training run's last step (``training_state.json``'s ``refreshes_end``)."""
    return read_state(directory).refreshes_end


def training_ends_at(directory: Path) -> float | None:
    """When a complete checkpoint's trainer expected its last step (:data:`TRAINING_ENDS_AT`),
    or None where it did not say."""
    return read_state(directory).training_ends_at


def refresh_requests(checkpoints: list[tuple[int, Path]]) -> list[tuple[int, Path]]:
    """Those of ``checkpoints`` (:func:`complete_checkpoints`' pairs, listed once by the caller)
    that ask for a refresh, in the same order; none once the newest says refreshes have ended
    (:func:`ends_refreshes`: an older request would not publish in time either)."""
    if checkpoints and ends_refreshes(checkpoints[-1][1]):
        return []
    return [(step, child) for step, child in checkpoints if wants_refresh(child)]


def _files_of(directory: Path) -> list[Path]:
    return sorted(path for path in directory.rglob("*") if path.is_file() and path.name != COMPLETE)


def mark_complete(directory: Path, state: dict[str, Any]) -> None:
    """Write ``training_state.json`` (checked against :class:`CheckpointState` first, so only
    what :func:`read_state` reads back is written), then the ``COMPLETE`` manifest (SHA-256 of
    every file)."""
    checked = CheckpointState(**state)  # refuses a state read_state would not read back
    atomic_write_json(directory / STATE_FILE, state)
    files = {str(path.relative_to(directory)): sha256_file(path) for path in _files_of(directory)}
    manifest = CheckpointManifest(step=checked.step, files=files)
    atomic_write_json(directory / COMPLETE, asdict(manifest))


def verify_checkpoint(directory: Path) -> CheckpointManifest:
    """Check every file of a complete checkpoint against its manifest; returns the manifest.

    Raises :class:`CheckpointIntegrityError` naming the first file that is missing, differs, or
    is not listed (a file added after the checkpoint was written is never loaded), or naming
    the manifest when it is not one (cut short, a key missing or of another type). Files listed
    as ``dropped`` may be missing; one still there must match too.
    """
    directory = Path(directory)
    marker = directory / COMPLETE
    try:
        manifest = _read_manifest(directory)
    except FileNotFoundError:
        raise CheckpointIntegrityError(
            f"{marker}: missing; the checkpoint is not complete"
        ) from None
    recorded, dropped = manifest.files, manifest.dropped
    present = {str(path.relative_to(directory)) for path in _files_of(directory)}
    unlisted = sorted(present - set(recorded) - set(dropped))
    if unlisted:
        raise CheckpointIntegrityError(
            f"{directory / unlisted[0]}: not in the checkpoint manifest {marker}; refusing to "
            f"load a checkpoint with files added after it was written"
        )
    for name, expected in sorted(recorded.items()):
        path = directory / name
        if not path.is_file():
            raise CheckpointIntegrityError(f"{path}: listed in {marker} but missing")
        _check_digest(path, expected, marker)
    for name in sorted(present & set(dropped)):  # left by a slimming that was interrupted
        _check_digest(directory / name, dropped[name], marker)
    return manifest


def _check_digest(path: Path, expected: str, marker: Path) -> None:
    actual = sha256_file(path)
    if actual != expected:
        raise CheckpointIntegrityError(
            f"{path}: sha256 {actual} does not match {expected} recorded in {marker}"
        )


def resumable(directory: Path) -> bool:
    """Whether training can resume from ``directory``: a complete checkpoint that still has its
    DeepSpeed state (its manifest lists none as dropped: :func:`drop_deepspeed_state`). A
    manifest that cannot be read (pruned meanwhile, corrupt) is not: the caller goes on to the
    newest checkpoint, which is verified before anything loads it."""
    try:
        return is_complete(directory) and not _read_manifest(directory).dropped
    except (OSError, ValueError):
        return False


def _read_manifest(directory: Path) -> CheckpointManifest:
    marker = Path(directory) / COMPLETE
    return read_document(marker, _MANIFEST, "checkpoint manifest", CheckpointIntegrityError)


def drop_deepspeed_state(directory: Path) -> bool:
    """Delete a complete checkpoint's DeepSpeed state, keeping its export and state file; True
    when there was any to delete.

    The manifest is re-signed first (atomically: the state's entries move from ``files`` to
    ``dropped``), then the files are deleted, so a crash at any moment leaves a checkpoint that
    verifies: before the re-signing it is the checkpoint as written; after it, every file left
    is one ``dropped`` lists, with its SHA-256. A second call deletes what an interrupted one
    left."""
    manifest = _read_manifest(directory)
    prefix = f"{DEEPSPEED_DIR}/"
    state = {name: digest for name, digest in manifest.files.items() if name.startswith(prefix)}
    if state:
        files = {name: digest for name, digest in manifest.files.items() if name not in state}
        slimmed = replace(manifest, files=files, dropped={**manifest.dropped, **state})
        atomic_write_json(directory / COMPLETE, asdict(slimmed))
    left = (directory / DEEPSPEED_DIR).exists()
    remove_owned(directory / DEEPSPEED_DIR, directory)
    return bool(state) or left


def resolve_checkpoint(run_dir: Path, spec: str) -> tuple[int | None, Path]:
    """(step or None, export directory) of ``spec``: ``newest`` (the run's newest complete
    checkpoint), a ``step-<S>/`` directory, or an ``export/`` directory of one.

    A checkpoint directory is verified against its manifest first. Raises
    :class:`InputError` when nothing matches.
    """
    if spec == "newest":
        newest = newest_checkpoint(run_dir)
        if newest is None:
            raise InputError(f"{checkpoints_root(run_dir)}: no complete checkpoint")
        step, directory = newest
    else:
        path = Path(spec)
        directory = path.parent if path.name == EXPORT_DIR else path
        if not is_complete(directory):
            raise InputError(
                f"{spec}: not a complete checkpoint (expected step-<S>/ with {COMPLETE} and "
                f"{EXPORT_DIR}/, or its {EXPORT_DIR}/ directory)"
            )
        step = checkpoint_step(directory) if _STEP_DIR.match(directory.name) else None
    verify_checkpoint(directory)
    return step, directory / EXPORT_DIR


def prune_checkpoints(run_dir: Path, keep: int) -> list[int]:
    """Keep the newest ``keep`` complete checkpoints, the one a refresh is encoding and the
    newest that asks for a refresh; delete the others, and unfinished ones older than the newest
    complete (left by a crash).

    The checkpoint being encoded is the one the holder of the run's refresh lock records
    (:func:`hnce.cluster.stores.lock_holder.encoding_checkpoint`); a refresh that lags behind therefore pins one
    checkpoint at most, and its next attempt jumps to the newest. The newest request outlives
    the checkpoints published after it only to resume from (``refresh.trigger: stale``), so the
    coordinator still finds it. Disk stays bounded at ``keep + 2`` checkpoints. Returns the steps
    deleted, oldest first.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    complete = complete_checkpoints(run_dir)
    if not complete:
        return []
    encoding = encoding_checkpoint(run_dir)
    newest = complete[-1][0]
    requested = [step for step, _ in refresh_requests(complete)]
    spared = {step for step, _ in complete[-keep:]} | {encoding} | set(requested[-1:])
    doomed = [(step, directory) for step, directory in complete if step not in spared]
    doomed += [
        (step, directory)
        for step, directory in _step_directories(run_dir)
        if step < newest and not is_complete(directory)
    ]
    doomed.sort()
    for _, directory in doomed:
        # Drop the marker first, so a concurrent reader never sees a complete, half-deleted one
        # (a step directory that is a link is only unlinked: what it points to is not the run's).
        if not directory.is_symlink():
            remove_owned(directory / COMPLETE, directory)
        remove_owned(directory, run_dir)
    return [step for step, _ in doomed]


def slim_checkpoints(run_dir: Path) -> list[int]:
    """Drop the DeepSpeed state of every complete checkpoint but the newest (the one training
    resumes from) and the one a refresh is encoding (it verifies that checkpoint against its
    manifest while it loads it; the next slimming takes it); returns the steps slimmed, oldest
    first. A step directory that is a link is left alone: what it points to is not the run's."""
    complete = complete_checkpoints(run_dir)
    spared = {step for step, _ in complete[-1:]} | {encoding_checkpoint(run_dir)}
    return [
        step
        for step, directory in complete
        if step not in spared and not directory.is_symlink() and drop_deepspeed_state(directory)
    ]
