"""``refresh.mode: sync``: at every checkpoint the trainer waits until the negatives mined with it
are live (the paper's own code, EntQA), so every step trains on negatives of the last checkpoint.

Each checkpoint asks for its refresh (``refresh.trigger: checkpoints``, the only trigger sync
takes), the coordinator refreshes it while the trainer waits (a ``refresh_wait`` event says how
long; under ``training.cores: handover`` the waiting trainer lends its threads to the encoders,
:mod:`hnce.pipeline.train.cores`), and the last checkpoint asks for none: nothing would train on
it.

Example::

    mode = SyncMode(steps=60, checkpoint_every=20)
    mode.waits_at(20), mode.waits_at(21)      # (True, False)
"""

from __future__ import annotations

from dataclasses import dataclass

from hnce.cluster.compute.refresh.modes import RefreshesEnd


@dataclass(frozen=True)
class SyncMode:
    """Training waits at every ``checkpoint_every`` steps (module docs)."""

    steps: int
    checkpoint_every: int

    def waits_at(self, step: int) -> bool:
        return 0 < step < self.steps and step % self.checkpoint_every == 0

    def refreshes_end(self, step: int) -> RefreshesEnd:
        return RefreshesEnd(step, None, None, step >= self.steps)
