"""``refresh.mode: async``: the coordinator refreshes beside a trainer that never waits, until no
refresh started now could publish before training ends.

ANCE's asynchronous refresh (Xiong et al. 2021, §3.2) pays a pass over the catalogue for
negatives the trainer then trains on. A refresh asked for at step t publishes no sooner than R
seconds later (:class:`~hnce.cluster.compute.refresh.timing.RefreshTiming`), and the run has

    (T - t) · s̄   seconds left,    T = ``training.steps``, s̄ = the mean seconds of its steps so far.

When R ≥ (T - t) · s̄ that version would publish after the last step: the coordinator would
abandon it when training ends, and until then its encoder actors hold the cores that
``training.cores: handover`` gives the trainer while no refresh encodes. The checkpoint of step t
then says that refreshes have ended (``refreshes_end`` in its ``training_state.json``,
:func:`hnce.cluster.stores.checkpoints.ends_refreshes`; a ``refreshes_end`` event) and the
coordinator starts none from it or from an older request. The last checkpoint always ends them
(nothing trains on what it would mine). Before any refresh has published, R is unknown and every
checkpoint asks as the trigger says.

Example::

    mode = AsyncMode(RefreshTiming(run_dir), steps=60)
    mode.refreshes_end(45).ends     # True once no refresh would land in time
"""

from __future__ import annotations

from dataclasses import dataclass

from hnce.cluster.compute.refresh.modes import RefreshesEnd
from hnce.cluster.compute.refresh.timing import RefreshTiming


@dataclass
class AsyncMode:
    """The trainer never waits; refreshes end as the module docs say."""

    timing: RefreshTiming
    steps: int

    def waits_at(self, step: int) -> bool:
        return False

    def refreshes_end(self, step: int) -> RefreshesEnd:
        self.timing.read_log()
        mean = self.timing.mean_step_seconds
        seconds_left = None if mean is None else (self.steps - step) * mean
        refresh = self.timing.refresh_seconds
        ends = step >= self.steps or (
            refresh is not None and seconds_left is not None and refresh >= seconds_left
        )
        return RefreshesEnd(step, refresh, seconds_left, ends)
