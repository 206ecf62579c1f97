"""When the mined negatives a run trains on have gone stale: ``refresh.trigger: stale``.

Zhang & Stratos ("Understanding Hard Negatives in Noise Contrastive Estimation", §3.1) show
that the bias of the hard-negative NCE gradient vanishes as the negative distribution matches the
*current* model's (Theorem 3.1; hard negatives are that distribution, eq. 8); ANCE (Xiong et al.
2021, as discussed there in §5) that hard negatives give larger gradients. Negatives mined with an
older checkpoint drift from both as training goes on: the model learns to score them below the
gold, so the loss on them falls.
A refresh every N steps pays for a pass over the catalogue whether or not that has happened;
this module measures it instead.

Over the steps trained on one negatives version v, with L_t the step's loss (the mean of its
micro-batches, :func:`hnce.pipeline.train.step.train_micro_batch`) and W = ``refresh.stale_window``,

    r_t = mean(L_{t-W+1} .. L_t) / mean(L_{s_v} .. L_{s_v+W-1}),    s_v: v's first step,

the loss of the last W steps against the loss of v's first W. Version v is *stale* when
r_t ≤ ``refresh.stale_loss_ratio`` (t ≥ s_v + 2W - 1, so the two windows do not overlap). The
trainer then publishes a checkpoint that asks for a refresh (``training_state.json``'s
``refresh``; :func:`hnce.cluster.stores.checkpoints.wants_refresh`), and the coordinator refreshes
only such checkpoints; a ``stale`` event in the run's event log records each request (step,
version, r_t). One request per version: the next is possible once the negatives mined
with it are live (a newer version, measured afresh from its own first steps).

The decision is rank 0's, from rank 0's losses, broadcast so that every rank publishes together.
A resumed run measures the version it resumes on from its first step after the resume.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class StalenessMonitor:
    """The loss ratio r_t of the module docs over the current negatives version; one per worker."""

    ratio: float
    window: int
    version: int | None = None
    requested: bool = False
    losses: list[float] = field(default_factory=list)

    def observe(self, version: int | None, loss: float) -> None:
        """Record one step's loss on negatives ``version`` (a new version starts afresh)."""
        if version != self.version:
            self.version, self.requested, self.losses = version, False, []
        if math.isfinite(loss):
            self.losses.append(loss)

    def loss_ratio(self) -> float | None:
        """r_t, or None until the version has 2W steps (or its first window's loss is 0)."""
        if len(self.losses) < 2 * self.window:
            return None
        first = sum(self.losses[: self.window]) / self.window
        last = sum(self.losses[-self.window :]) / self.window
        return last / first if first > 0 else None

    def stale(self) -> bool:
        """Whether to ask for a refresh now: the version is stale and not yet asked for."""
        ratio = self.loss_ratio()
        return not self.requested and ratio is not None and ratio <= self.ratio

    def mark_requested(self) -> None:
        """The refresh of this version was asked for: no second request until it is live."""
        self.requested = True
