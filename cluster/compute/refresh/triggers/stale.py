"""``refresh.trigger: stale``: a refresh is asked for once the negatives in use have gone stale.

Zhang & Stratos ("Understanding Hard Negatives in Noise Contrastive Estimation", §3.1) show
that the bias of the hard-negative NCE gradient vanishes as the negative distribution matches the
*current* model's (Theorem 3.1; hard negatives are that distribution, eq. 8); ANCE (Xiong et al.
2021, as discussed there in §5) that hard negatives give larger gradients. Negatives mined with an
older checkpoint drift from both as training goes on: the model learns to score them below the
gold, so the loss on them falls.
A refresh every N steps pays for a pass over the catalogue whether or not that has happened;
this module measures it instead.

Over the steps trained on one negatives version v, with L_t the step's loss (the mean of its
micro-batches, :func:`hnce.pipeline.train.step.train_micro_batch`) and W = ``refresh.stale.window``,

    r_t = mean(L_{t-W+1} .. L_t) / mean(L_{s_v} .. L_{s_v+W-1}),    s_v: v's first step,

the loss of the last W steps against the loss of v's first W. Version v is *stale* when
r_t ≤ ``refresh.stale.loss_ratio`` (t ≥ s_v + 2W - 1, so the two windows do not overlap). The
trainer then publishes a checkpoint that asks for a refresh (``training_state.json``'s
``refresh``; :func:`hnce.cluster.stores.checkpoints.wants_refresh`), and the coordinator refreshes
only such checkpoints (the others are kept for resuming); a ``refresh_decision`` event records
each request (step, version, r_t). One request per version: the next is possible once the negatives mined
with it are live (a newer version, measured afresh from its own first steps).

The decision is rank 0's, from rank 0's losses, broadcast so that every rank publishes together.
A resumed run measures the version it resumes on from its first step after the resume.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hnce.cluster.compute.refresh.policy import (
    NO_REFRESH,
    Decision,
    TriggerContext,
    TriggerSpec,
)
from hnce.settings import Fraction, PositiveInt, settings


@settings
class StaleOptions:
    """``refresh.stale``: when the negatives in use have gone stale (module docs).

    Attributes:
        loss_ratio: ask for a refresh once the mean loss of the last ``window`` steps on a
            negatives version is at most this share of the mean of its first ``window``.
        window: W, steps in each of the two windows of the ratio.
    """

    loss_ratio: Fraction = 0.8
    window: PositiveInt = 10


@dataclass
class StalenessMonitor:
    """The loss ratio r_t of the module docs over the current negatives version; one per worker,
    rank 0's decides."""

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

    def after_step(self, step: int, loss: float, version: int | None) -> None:
        self.observe(version, loss)

    def look(self, step: int) -> Decision:
        """Ask for a refresh now when the version went stale (module docs)."""
        if not self.stale():
            return NO_REFRESH
        ratio = self.loss_ratio()
        fields = {"step": step, "refresh": True, "version": self.version, "loss_ratio": ratio}
        return Decision(True, fields)

    def at_checkpoint(self, step: int) -> Decision:
        """A checkpoint of the cadence asks for nothing: only :meth:`look`'s requests do."""
        return NO_REFRESH

    def asked(self, step: int) -> None:
        """The refresh of this version was asked for: no second request until it is live."""
        self.requested = True


def _summary(decisions: list[dict[str, Any]]) -> str:
    """``hnce status``: how many refreshes were asked for, and the last request."""
    if not decisions:
        return "stale: no refresh asked for yet"
    last = decisions[-1]
    ratio = last.get("loss_ratio")
    ratio = f"{ratio:.3f}" if isinstance(ratio, int | float) else "unknown"
    return (
        f"stale: {len(decisions)} refresh(es) asked for; the last at step {last.get('step')} "
        f"on negatives version {last.get('version')}, loss ratio {ratio}"
    )


def _build(context: TriggerContext) -> StalenessMonitor:
    return StalenessMonitor(context.options.loss_ratio, context.options.window)


SPEC = TriggerSpec(
    name="stale",
    build=_build,
    options=StaleOptions,
    scalars={"loss_ratio": "negatives/stale_loss_ratio"},
    summary=_summary,
)
