"""Which model a kept encoder pool's actors hold (:class:`hnce.cluster.compute.encoder_pool.KeptPool`).

A module of its own with no heavy import: Ray imports the module of an actor's class in the
actor's worker, and a process that only holds two paths need not import torch and FAISS.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PoolModel:
    """The model an encoder pool's actors hold: its `export/` directory and the catalogue's
    token store (None: the pool encodes no entity)."""

    export_dir: str
    token_store: str | None


class ModelPointer:
    """Which model a kept pool's actors load (a Ray actor of a
    :class:`~hnce.cluster.compute.encoder_pool.KeptPool`). An actor reads it on each reload and
    when Ray restarts it: a restart repeats the arguments the actor was first created with, so
    without the pointer a restarted actor of a pool reloaded since would load its first model."""

    def __init__(self, model: PoolModel) -> None:
        self.model = model

    def set(self, model: PoolModel) -> None:
        self.model = model

    def get(self) -> PoolModel:
        return self.model
