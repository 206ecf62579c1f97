"""What the refreshes of one run do: :class:`RefreshPlan`, read by the coordinator, ``hnce
refresh``, the initial negatives and every search of an index version
(:mod:`hnce.cluster.compute.retrieval`); the pipeline makes it from the recipe
(:func:`hnce.pipeline.run.refresh_plan`).

Example::

    plan = RefreshPlan(run_dir, data_dir, RefreshSettings(), IndexSpec())
    plan.negatives_store.latest("train")
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hnce.cluster.compute.encoder_pool import WAIT_FLOOR_SECONDS, EncoderPoolSettings
from hnce.cluster.compute.refresh.heldout import HeldoutSpec
from hnce.cluster.compute.refresh.settings import RefreshSettings
from hnce.cluster.stores.index_spec import IndexSpec
from hnce.cluster.stores.index_store import INDEX_DIR, IndexStore
from hnce.cluster.stores.negatives_store import NEGATIVES_DIR, NegativesStore

#: the slowest an entity is encoded, in seconds: a shared CPU core at 128 tokens (the full-scale
#: run's 25,000-entity shards took up to two hours there); a shard's first wait is no hang before
#: its entities would take this long
SLOWEST_ENTITY_SECONDS = 0.3


def wait_floor_seconds(shard_size: int) -> float:
    """The least time a wait on an encoder actor may take before it is reported as hung: the
    first shard of ``shard_size`` entities at the slowest pace, and never under
    :data:`~hnce.cluster.compute.encoder_pool.WAIT_FLOOR_SECONDS`."""
    return max(WAIT_FLOOR_SECONDS, SLOWEST_ENTITY_SECONDS * shard_size)


@dataclass(frozen=True)
class RefreshPlan:
    """What the refreshes of one run do: where (run and dataset directories), how (the
    ``refresh`` and ``index`` sections), which held-out mentions each scores (None: none), how
    many torch threads a trainer waiting for each refresh lends its encoders (``lent_threads``,
    :class:`hnce.cluster.compute.encoder_pool.EncoderPoolSettings`), and, on GPUs, the share of a
    GPU each encoder actor takes and the GPUs the trainer beside it holds (``encoder_gpus``,
    ``trainer_gpus``: :mod:`hnce.cluster.compute.gpu_sharing`)."""

    run_dir: Path
    data_dir: Path
    refresh: Any = field(default_factory=RefreshSettings)
    index: IndexSpec = field(default_factory=IndexSpec)
    heldout: HeldoutSpec | None = None
    lent_threads: int = 0
    encoder_gpus: float = 1.0
    trainer_gpus: float = 0.0

    @property
    def index_store(self) -> IndexStore:
        return IndexStore(self.run_dir / INDEX_DIR, keep=self.index.keep_versions)

    @property
    def negatives_store(self) -> NegativesStore:
        return NegativesStore(self.run_dir / NEGATIVES_DIR, keep=self.index.keep_versions)

    def pool_settings(self, alone: bool = False) -> EncoderPoolSettings:
        """The encoder pool of this plan; ``alone`` for a pool with no trainer beside it
        (the initial negatives, evaluation, linking), which uses the CPUs Ray has free."""
        return EncoderPoolSettings(
            num_encoders=self.refresh.num_encoders,
            batch_size=self.refresh.encoder_batch_size,
            num_threads=self.refresh.encoder_cpus,
            free_cpus=alone,
            lent_threads=0 if alone else self.lent_threads,
            gpus_per_actor=self.encoder_gpus,
            reserved_gpus=0.0 if alone else self.trainer_gpus,
            wait_floor_seconds=wait_floor_seconds(self.refresh.shard_size),
            faiss_device=self.index.faiss_device,
        )
