"""``refresh.trigger: checkpoints``: every checkpoint asks for a refresh, every
``training.checkpoint_every`` steps; the coordinator refreshes the newest, skipping older ones
not yet refreshed. The only trigger of ``refresh.mode: sync``, which waits at each checkpoint.

Example::

    trigger = SPEC.build(context)
    trigger.at_checkpoint(40).refresh     # True
"""

from __future__ import annotations

from hnce.cluster.compute.refresh.policy import (
    NO_REFRESH,
    Decision,
    TriggerContext,
    TriggerSpec,
)

_ASKS = Decision(True)


class EveryCheckpoint:
    """Every checkpoint asks; no look between them asks, and nothing is logged."""

    def after_step(self, step: int, loss: float, version: int | None) -> None:
        pass

    def look(self, step: int) -> Decision:
        return NO_REFRESH

    def at_checkpoint(self, step: int) -> Decision:
        return _ASKS

    def asked(self, step: int) -> None:
        pass


def _build(context: TriggerContext) -> EveryCheckpoint:
    return EveryCheckpoint()


SPEC = TriggerSpec(
    name="checkpoints",
    build=_build,
    asynchronous=False,
    summary=lambda decisions: "checkpoints (every checkpoint is refreshed)",
)
