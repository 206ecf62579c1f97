"""The trainer's view of the refreshed negatives: switch to the newest version, never wait.

Every C steps rank 0 reads ``<run>/negatives/CURRENT`` and broadcasts the version number, so
all workers switch at the same step (DESIGN.md §5). Until the first version is published
:attr:`current` is None and the trainer draws random negatives. The lag of a version is the
number of steps between the checkpoint whose model mined it and the step that uses it.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from cluster.negatives_store import NegativesStore, NegativesVersion
from cluster.versioned_dir import version_dir_name


class RefreshedNegatives:
    """Holds the negatives version in use and switches when a newer one is published."""

    def __init__(self, root: Path, split: str) -> None:
        self.store = NegativesStore(root)
        self.split = split
        self.current: NegativesVersion | None = None

    @property
    def version(self) -> int:
        """Version number in use, -1 before the first refresh."""
        return -1 if self.current is None else self.current.version

    def lag(self, step: int) -> int | None:
        """Steps between the checkpoint the negatives were mined with and ``step``."""
        return None if self.current is None else step - self.current.checkpoint_step

    def poll(self) -> bool:
        """Switch to the newest published version if it changed; True when it switched.

        Collective over the process group when one is initialised (all ranks must call it).
        """
        newest = self.store.current_version()
        chosen = torch.tensor([-1 if newest is None else newest], dtype=torch.long)
        if dist.is_available() and dist.is_initialized():
            dist.broadcast(chosen, src=0)
        version = int(chosen.item())
        if version < 0 or version == self.version:
            return False
        path = self.store.root / version_dir_name(version) / f"{self.split}.parquet"
        try:
            self.current = NegativesVersion(path)
        except FileNotFoundError:
            # Retention removed it between the read and the open; the next poll sees a newer one.
            return False
        return True
