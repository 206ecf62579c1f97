"""A training run's checkpoints on the DeepSpeed side: publishing ``step-<S>/``, resuming safely.

The layout and its SHA-256 manifest belong to :mod:`hnce.cluster.stores.checkpoints`. Here:

- :func:`publish_checkpoint`: DeepSpeed state on every rank, the Hugging Face export on rank 0
  (under ZeRO-3 from parameters gathered from every rank), then the ``COMPLETE`` manifest,
  pruning and, with ``training.keep_deepspeed_state: newest``, the older checkpoints' DeepSpeed
  state dropped; :func:`report_checkpoint` gives Ray Train the pointer a restarted worker group
  resumes from;
- :func:`agreed_resume_step` and :func:`load_training_state`: the step to resume from (rank 0
  decides, every rank follows; never one whose DeepSpeed state was dropped), verified against
  its manifest, then loaded through :class:`WeightsOnlyCheckpointEngine`;
- :class:`WorkerCheckpoints`: a worker's side of both, the part of its loop that resumes and
  publishes (only finite weights: :mod:`hnce.pipeline.train.nonfinite`).

Trust: DeepSpeed's own loader calls ``torch.load(weights_only=False)``, which runs any code a
pickle names. Whoever can write to ``run.dir`` controls both the state files and their manifest,
so the manifest alone cannot stop a crafted file; loading every state file with
``weights_only=True`` (tensors, containers and the few DeepSpeed data types listed in
:data:`ALLOWED_GLOBALS`) can. Such a file makes the resume fail with
:class:`UnsafeCheckpointError`; it never runs (docs/failures.md, "Trust").
"""

from __future__ import annotations

import pickle
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import deepspeed
import ray.train
import torch
from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
from deepspeed.runtime.zero.config import ZeroStageEnum
from deepspeed.utils.tensor_fragment import fragment_address
from pydantic import TypeAdapter
from torch import nn

from hnce.cluster.stores.checkpoints import (
    DEEPSPEED_DIR,
    DEEPSPEED_TAG,
    EXPORT_DIR,
    TRAINING_ENDS_AT,
    CheckpointIntegrityError,
    checkpoint_dir,
    mark_complete,
    newest_checkpoint,
    prune_checkpoints,
    resumable,
    slim_checkpoints,
    verify_checkpoint,
)
from hnce.cluster.stores.files import AtomicPath
from hnce.documents import document_record, read_document
from hnce.errors import naming_refused_writes
from hnce.events import RunEvent
from hnce.pipeline.config import DeepSpeedStateKept
from hnce.pipeline.event_log import EventLog
from hnce.pipeline.recipe_models import export_trainable
from hnce.pipeline.train.distributed import Collectives
from hnce.pipeline.train.nonfinite import weights_stop

POINTER_FILE = "hnce_checkpoint.json"


@document_record
class CheckpointPointer:
    """:data:`POINTER_FILE`, what rank 0 reports to Ray Train with each checkpoint: its step,
    which a restarted worker group resumes from."""

    step: int


_POINTER = TypeAdapter(CheckpointPointer)

# Plain-data types DeepSpeed pickles into its model and optimizer states (ZeRO 0-3, fp32 and
# bf16): the only globals a state file may name besides tensors and containers.
ALLOWED_GLOBALS = [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


class UnsafeCheckpointError(CheckpointIntegrityError):
    """A state file names Python objects outside :data:`ALLOWED_GLOBALS`: refused, never run."""


class WeightsOnlyCheckpointEngine(TorchCheckpointEngine):
    """DeepSpeed's torch checkpoint engine with every load done ``weights_only=True``, and every
    save written atomically through a Python file (:class:`~hnce.cluster.stores.files.AtomicPath`):
    ``torch.save`` to a file name reports a full disk as a ``RuntimeError`` naming no file and
    leaves the file cut short; through a file object it is the ``OSError``, here naming the
    state file (docs/failures.md, "Disks that fill")."""

    def save(self, state_dict: Any, path: str) -> None:
        with AtomicPath(Path(path)) as temporary, temporary.open("wb") as handle:
            zipped = self.zipfile_serialization
            torch.save(state_dict, handle, _use_new_zipfile_serialization=zipped)

    def load(self, path: str, map_location: Any = None) -> Any:
        with torch.serialization.safe_globals(ALLOWED_GLOBALS):
            try:
                return torch.load(path, map_location=map_location, weights_only=True)
            except pickle.UnpicklingError as error:
                reason = str(error).splitlines()
                detail = next((line for line in reason if "Unsupported" in line), reason[0])
                raise UnsafeCheckpointError(
                    f"{path}: refusing to resume from this file: it is not plain tensor data "
                    f"({detail.strip()}); a checkpoint hnce wrote never is. Whoever can write to "
                    f"the run directory may have planted it: remove that checkpoint directory"
                ) from None


def use_weights_only_loading(engine: deepspeed.DeepSpeedEngine) -> None:
    """Make every later ``engine.load_checkpoint`` load with ``weights_only=True`` (and every
    ``save_checkpoint`` write atomically: :class:`WeightsOnlyCheckpointEngine`)."""
    engine.checkpoint_engine = WeightsOnlyCheckpointEngine(engine._config)


def reported_checkpoint_step() -> int | None:
    """The step of the checkpoint this worker group last reported to Ray Train (set when Ray
    Train restarts a failed group), or None."""
    reported = ray.train.get_checkpoint()
    if reported is None:
        return None
    with reported.as_directory() as directory:
        return read_pointer(Path(directory))


def read_pointer(directory: Path) -> int:
    """The step of the checkpoint pointer in ``directory``, validated; a
    :class:`CheckpointIntegrityError` naming the file otherwise."""
    path = directory / POINTER_FILE
    try:
        return read_document(path, _POINTER, "checkpoint pointer", CheckpointIntegrityError).step
    except FileNotFoundError:
        raise CheckpointIntegrityError(f"{path}: missing from Ray Train's checkpoint") from None


def report_checkpoint(step: int, loss: float, rank: int) -> None:
    """Report checkpoint ``step`` to Ray Train (every rank calls it; rank 0 attaches the pointer
    a restarted worker group resumes from)."""
    with tempfile.TemporaryDirectory(prefix="hnce-pointer-") as pointer_dir:
        checkpoint = None
        if rank == 0:
            pointer = _POINTER.dump_json(CheckpointPointer(step=step))
            (Path(pointer_dir) / POINTER_FILE).write_bytes(pointer)
            checkpoint = ray.train.Checkpoint.from_directory(pointer_dir)
        ray.train.report({"step": step, "loss": loss}, checkpoint=checkpoint)


def agreed_resume_step(run_dir: Path, collectives: Collectives, reported: int | None) -> int | None:
    """The checkpoint step every rank resumes from (rank 0's choice, broadcast): ``reported``
    (Ray Train's pointer) when that checkpoint still exists with its DeepSpeed state, else the
    newest complete one on disk (a worker lost after publishing a checkpoint, before reporting
    it, leaves a pointer to the one before, whose state the publication may have dropped); None
    to start afresh."""
    step = -1
    if collectives.rank == 0:
        if reported is not None and resumable(checkpoint_dir(run_dir, reported)):
            step = reported
        else:
            newest = newest_checkpoint(run_dir)
            step = -1 if newest is None else newest[0]
    step = collectives.broadcast_int(step)
    return None if step < 0 else step


def load_training_state(engine: deepspeed.DeepSpeedEngine, run_dir: Path, step: int) -> Path:
    """Verify checkpoint ``step`` against its manifest, then load its DeepSpeed state (model,
    optimizer, scheduler) weights-only; returns its directory."""
    path = checkpoint_dir(run_dir, step)
    if verify_checkpoint(path).dropped:
        raise CheckpointIntegrityError(
            f"{path}: its DeepSpeed state was dropped (training.keep_deepspeed_state: newest); "
            f"training resumes only from the newest checkpoint, which keeps it"
        )
    loaded, _ = engine.load_checkpoint(str(path / DEEPSPEED_DIR), tag=DEEPSPEED_TAG)
    if loaded is None:
        raise CheckpointIntegrityError(f"{path / DEEPSPEED_DIR}: no DeepSpeed state to resume")
    return path


def publish_checkpoint(
    engine: deepspeed.DeepSpeedEngine,
    model: nn.Module,
    run_dir: Path,
    state: dict[str, Any],
    collectives: Collectives,
    keep: int,
    log: EventLog | None,
    deepspeed_state: DeepSpeedStateKept = "all",
    training_state: Callable[[Path], None] | None = None,
) -> None:
    """Write ``step-<S>/`` (S = ``state["step"]``) under ``run_dir``: DeepSpeed state (all
    ranks) and what ``training_state`` writes into the checkpoint beside it (every rank calls
    it: the negative cache's rows), the export (rank 0; ZeRO-3 parameters gathered first),
    ``COMPLETE`` with ``state``
    last, prune to ``keep`` (:func:`hnce.cluster.stores.checkpoints.prune_checkpoints`; rank 0, which holds
    ``log``) and, when ``deepspeed_state`` is ``newest``, drop the older checkpoints' DeepSpeed
    state (:func:`~hnce.cluster.stores.checkpoints.slim_checkpoints`), only now that this one,
    which keeps it, is complete. A write the machine refuses (a full disk) is an ``OSError``
    naming the file, and leaves ``step-<S>/`` without ``COMPLETE``: the newest complete
    checkpoint stays the one to resume from (docs/failures.md, "Disks that fill")."""
    step = int(state["step"])
    directory = checkpoint_dir(run_dir, step)
    with naming_refused_writes(directory / DEEPSPEED_DIR):  # DeepSpeed's own `latest` file
        engine.save_checkpoint(str(directory / DEEPSPEED_DIR), tag=DEEPSPEED_TAG)
    if training_state is not None:
        training_state(directory)
    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        if collectives.rank == 0:
            export_trainable(model, directory / EXPORT_DIR)
    collectives.barrier()
    if log is not None:
        mark_complete(directory, state)
        prune_checkpoints(run_dir, keep)
        if deepspeed_state == "newest":
            slim_checkpoints(run_dir)
        log.write(
            RunEvent.CHECKPOINT,
            step=step,
            path=str(directory),
            training_ends_at=state.get(TRAINING_ENDS_AT),
        )


#: hears of every published checkpoint: (step, loss, rank); :func:`report_checkpoint` under Ray
#: Train
CheckpointReport = Callable[[int, float, int], None]


@dataclass
class WorkerCheckpoints:
    """One worker's checkpoints of one task's run (``run_dir``, ``keep`` of them kept, the
    DeepSpeed state of those ``deepspeed_state`` says): the step it resumes from and each
    checkpoint it publishes, which ``report`` hears of; ``log``: rank 0's event log."""

    engine: deepspeed.DeepSpeedEngine
    model: nn.Module
    run_dir: Path
    collectives: Collectives
    keep: int
    log: EventLog | None
    report: CheckpointReport
    deepspeed_state: DeepSpeedStateKept = "all"

    def resume(self, reported_step: int | None, setup_seconds: dict[str, float]) -> int | None:
        """Load the checkpoint every rank agrees on (:func:`agreed_resume_step` of Ray Train's
        ``reported_step``), logging a ``resume`` event with the worker's ``setup_seconds``; its
        step, or None to start afresh."""
        step = agreed_resume_step(self.run_dir, self.collectives, reported_step)
        if step is None:
            return None
        path = load_training_state(self.engine, self.run_dir, step)
        if self.log is not None:
            self.log.write(RunEvent.RESUME, step=step, path=str(path), setup_seconds=setup_seconds)
        return step

    def publish(
        self,
        state: Mapping[str, Any],
        request: Callable[[], Mapping[str, Any]] = dict,
        training_state: Callable[[Path], None] | None = None,
    ) -> bool:
        """Checkpoint ``step-<S>/`` (S = ``state["step"]``, with its ``"loss"``) holding
        ``state`` and then ``request()``'s entries (what it asks of the refresh coordinator,
        asked only once the weights are known finite) and what ``training_state`` writes beside
        the DeepSpeed state (:func:`publish_checkpoint`), reported; False on every rank, nothing
        published and a stop logged, when some rank's weights are not finite."""
        step = int(state["step"])
        if weights_stop(self.collectives, self.model, step, self.log):
            return False
        published = {**state, **request()}
        publish_checkpoint(
            self.engine,
            self.model,
            self.run_dir,
            published,
            self.collectives,
            self.keep,
            self.log,
            self.deepspeed_state,
            training_state,
        )
        self.report(step, float(state["loss"]), self.collectives.rank)
        return True
