"""Training never goes on, or publishes, on numbers that are no longer numbers.

After every optimizer step the workers compare notes (one small collective): if the training
loss of any rank is NaN or infinite, ``training.on_nonfinite`` decides. ``stop`` (the default):
rank 0 writes a ``nonfinite_stop`` event naming the step, the ranks and the likely causes, and
every rank leaves the loop at that step; the driver then raises :class:`NonFiniteTraining`, one
line for the user, and no checkpoint of that state exists. ``warn``: the event is a
``nonfinite_loss`` warning and training goes on. Either way a checkpoint is published only when
every rank's weights are finite (:func:`nonfinite_ranks` over the weights first), so neither a
refresh nor an evaluation ever encodes with a diverged model.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from hnce.cluster.stores.run_events import read_events
from hnce.errors import InputError
from hnce.events import RunEvent
from hnce.pipeline.event_log import EventLog
from hnce.pipeline.train.distributed import Collectives

logger = logging.getLogger(__name__)


class NonFiniteTraining(InputError):
    """The training loss or weights stopped being finite: a setting (most often the learning
    rate, or a loss temperature) or the data must change before training again."""


def nonfinite_ranks(collectives: Collectives, finite: bool) -> list[int]:
    """The ranks whose ``finite`` is False, on every rank (a collective: all ranks call it)."""
    flag = torch.tensor([0 if finite else 1], dtype=torch.long, device=collectives.device)
    if not collectives.active:
        return [] if finite else [0]
    flags = [torch.zeros_like(flag) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(flags, flag)
    return [rank for rank, value in enumerate(flags) if int(value.item())]


def weights_are_finite(model: nn.Module) -> bool:
    """Every weight this rank holds is finite (its partition under ZeRO-3)."""
    return all(
        bool(torch.isfinite(getattr(parameter, "ds_tensor", parameter)).all())
        for parameter in model.parameters()
    )


def loss_cause(step: int, ranks: list[int], loss: float) -> str:
    """What a user reads when the loss stops being finite at ``step``."""
    shown = "nan" if math.isnan(loss) else f"{loss}"
    return (
        f"step {step}: the training loss is not finite on rank(s) {ranks} (rank 0's: {shown}); "
        f"training stopped before any checkpoint of this state (training.on_nonfinite). Lower "
        f"training.learning_rate, raise a loss temperature, or check the data"
    )


def weights_cause(step: int, ranks: list[int]) -> str:
    """What a user reads when a checkpoint would hold non-finite weights."""
    return (
        f"step {step}: the weights on rank(s) {ranks} are not finite; the checkpoint was not "
        f"published and training stopped. Lower training.learning_rate or "
        f"training.max_grad_norm"
    )


def loss_stops(
    collectives: Collectives,
    step: int,
    loss: float,
    on_nonfinite: Literal["stop", "warn"],
    log: EventLog | None,
) -> bool:
    """True on every rank when some rank's ``loss`` at ``step`` is not finite and
    ``on_nonfinite`` (``training.on_nonfinite``) stops; the cause is logged in ``log`` (rank 0's)
    as a stop or a warning either way."""
    ranks = nonfinite_ranks(collectives, math.isfinite(loss))
    if not ranks:
        return False
    stop = on_nonfinite == "stop"
    cause = loss_cause(step, ranks, loss)
    if log is not None:
        log.write(
            RunEvent.NONFINITE_STOP if stop else RunEvent.NONFINITE_LOSS, step=step, cause=cause
        )
    logger.warning("rank %d: %s", collectives.rank, cause)
    return stop


def weights_stop(
    collectives: Collectives, model: nn.Module, step: int, log: EventLog | None
) -> bool:
    """True on every rank when some rank's weights are not finite, so the checkpoint of
    ``step`` must not be published (a stop logged in ``log``, rank 0's)."""
    ranks = nonfinite_ranks(collectives, weights_are_finite(model))
    if ranks and log is not None:
        log.write(RunEvent.NONFINITE_STOP, step=step, cause=weights_cause(step, ranks))
    return bool(ranks)


def raise_if_diverged(run_dir: Path, since: float) -> None:
    """Raise :class:`NonFiniteTraining` when the workers stopped for non-finite numbers (a
    ``nonfinite_stop`` event at or after ``since``, the driver's start)."""
    stops = [
        event for event in read_events(run_dir, RunEvent.NONFINITE_STOP) if event["time"] >= since
    ]
    if stops:
        raise NonFiniteTraining(stops[-1]["cause"])
