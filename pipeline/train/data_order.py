"""The order in which a run visits its training mentions, a pure function of (seed, step).

A resumed run recomputes exactly the batches an uninterrupted run would have seen from the
resume step on (docs/failures.md): each epoch is a permutation drawn from ``seed + epoch``, cut into
global batches of ``batch_size * world_size`` mentions, and each rank takes its own slice.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np


@lru_cache(maxsize=2)
def _permutation(num_mentions: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).permutation(num_mentions)


@dataclass(frozen=True)
class MentionOrder:
    """Deterministic batches of mention indices for every (micro-step, rank)."""

    num_mentions: int
    batch_size: int
    world_size: int
    seed: int

    def __post_init__(self) -> None:
        if self.num_mentions < self.batch_size * self.world_size:
            raise ValueError(
                f"{self.num_mentions} training mentions cannot fill one global batch of "
                f"{self.batch_size} x {self.world_size} workers"
            )

    @property
    def batches_per_epoch(self) -> int:
        return self.num_mentions // (self.batch_size * self.world_size)

    def batch(self, micro_step: int, rank: int) -> np.ndarray:
        """Mention indices for ``rank`` at ``micro_step`` (0-based, counted across epochs)."""
        epoch, position = divmod(micro_step, self.batches_per_epoch)
        global_size = self.batch_size * self.world_size
        start = position * global_size + rank * self.batch_size
        return _permutation(self.num_mentions, self.seed + epoch)[start : start + self.batch_size]
