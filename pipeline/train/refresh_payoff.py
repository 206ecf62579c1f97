"""Whether a refresh started now can still publish before training ends (asynchronous refresh).

ANCE's asynchronous refresh (Xiong et al. 2021, §3.2) pays a pass over the catalogue for
negatives the trainer then trains on. A refresh asked for at step t publishes its version no
sooner than R seconds later, R the duration of the run's fastest published refresh less the
seconds it spent starting its encoder pool (the records in the run's refresh log,
``hnce.cluster.stores.refresh_log``: a run's first refresh starts the pool that its later ones
keep), and the run has

    (T - t) · s̄   seconds left,    T = ``training.steps``, s̄ = the mean seconds of its steps so far.

When R ≥ (T - t) · s̄ that version would publish after the last step: the training coordinator
would abandon the refresh when training ends, and until then its encoder actors hold the cores
that ``training.cores: handover`` gives the trainer while no refresh encodes. The checkpoint of
step t then says that refreshes have ended (``refreshes_end`` in its ``training_state.json``,
``hnce.cluster.stores.checkpoints.ends_refreshes``) and the coordinator starts none from it or
from an older request. The last checkpoint always ends them (nothing trains on what it would
mine). Before any refresh has published, R is unknown and every checkpoint asks as the recipe
says (``refresh.trigger``).

Example::

    payoff = RefreshPayoff(run_dir, steps=60)
    payoff.observe(2.4)                      # after every step: its seconds
    estimate = payoff.estimate(45)           # at a checkpoint
    estimate.ends                            # True: no refresh would land in time
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hnce.cluster.stores.refresh_log import fastest_refresh_seconds, read_log


@dataclass(frozen=True)
class PayoffEstimate:
    """At one checkpoint: the fastest published refresh's seconds without its pool's start (None
    before the first), the seconds training has left, and whether refreshes end here."""

    step: int
    refresh_seconds: float | None
    seconds_left: float | None
    ends: bool


@dataclass
class RefreshPayoff:
    """The module docs' estimate for one run; one per worker (rank 0's decides)."""

    run_dir: Path
    steps: int
    step_seconds: list[float] = field(default_factory=list)
    refresh_seconds: float | None = None
    log_offset: int = 0

    def observe(self, seconds: float) -> None:
        """Record one step's seconds."""
        self.step_seconds.append(seconds)

    def estimate(self, step: int) -> PayoffEstimate:
        """Whether refreshes end at the checkpoint of ``step`` (module docs)."""
        log = read_log(self.run_dir, self.log_offset)
        self.log_offset = log.offset
        fastest = fastest_refresh_seconds(log.records)
        if fastest is not None:
            known = self.refresh_seconds
            self.refresh_seconds = fastest if known is None else min(known, fastest)
        seconds_left = None
        if self.step_seconds:
            mean = sum(self.step_seconds) / len(self.step_seconds)
            seconds_left = (self.steps - step) * mean
        ends = step >= self.steps or (
            self.refresh_seconds is not None
            and seconds_left is not None
            and self.refresh_seconds >= seconds_left
        )
        return PayoffEstimate(step, self.refresh_seconds, seconds_left, ends)
