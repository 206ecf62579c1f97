"""What one run of the shared driver trains: the retriever (``hnce train``) or the joint reranker
(``hnce rerank``).

Both go through the same driver (``hnce.pipeline.train.trainer``), worker loop and step; a task says
only where the run lives, which settings drive it and where its negatives come from:

=========  ==================  ===========================  ======================================
task       run directory       settings                     negatives
=========  ==================  ===========================  ======================================
retriever  ``run.dir``         ``training``                 ``negatives`` over refreshed versions
reranker   ``run.dir/rerank``  ``training`` updated by      greedy over a fixed retriever's top-N
                               ``rerank.training``
=========  ==================  ===========================  ======================================

A task is plain data, so Ray Train hands it to every worker (:meth:`TrainingTask.to_dict`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hnce.pipeline.config import Config, TrainingSettings
from hnce.pipeline.run import TaskKind, rerank_run_dir
from hnce.pipeline.train.batch import ShareMode


@dataclass(frozen=True)
class TrainingTask:
    """A retriever or reranker training run (see the module docstring).

    ``candidates``: the reranker's fixed candidates, a negatives-version Parquet file of the
    train split (``hnce.cluster.stores.negatives_store``); None for the retriever.
    """

    kind: TaskKind
    run_dir: Path
    candidates: Path | None = None

    @classmethod
    def retriever(cls, config: Config) -> TrainingTask:
        return cls("retriever", config.run_dir.resolve())

    @classmethod
    def reranker(cls, config: Config, candidates: Path) -> TrainingTask:
        return cls("reranker", rerank_run_dir(config), Path(candidates).resolve())

    def settings(self, config: Config) -> TrainingSettings:
        """The DeepSpeed / Ray Train settings of this task."""
        return config.training if self.kind == "retriever" else config.reranker_training()

    def share(self, config: Config) -> ShareMode:
        """``negatives.share`` for the retriever; the reranker, a cross-encoder paying one pass
        per (mention, entity) pair, scores each mention against its own candidates."""
        return config.negatives.share if self.kind == "retriever" else "none"

    def refreshes(self, config: Config) -> bool:
        """Whether a refresh coordinator runs beside the training (a retriever on an index)."""
        return self._on_index(config) and config.refresh.enabled

    def waits_for_refreshes(self, config: Config) -> bool:
        """Whether the workers wait for each refresh (``refresh.mode: sync``)."""
        return self.refreshes(config) and config.refresh.mode == "sync"

    def initial_negatives(self, config: Config) -> str:
        """Where the initial negatives come from (``negatives.initial``; random: none)."""
        return config.negatives.initial if self._on_index(config) else "random"

    def encoders_beside(self, config: Config) -> bool:
        """Whether encoder actors run beside the workers: a refresh, or the initial negatives
        mined with the starting model."""
        return self.refreshes(config) or self.initial_negatives(config) == "model"

    def caches_negatives(self, config: Config) -> bool:
        """Whether its workers draw index candidates from a negative cache (a retriever with
        ``negatives.cache.enabled``; :mod:`hnce.pipeline.train.trainer_cache`)."""
        return self.kind == "retriever" and config.negatives.cache.enabled

    def _on_index(self, config: Config) -> bool:
        return self.kind == "retriever" and config.negatives.source == "index"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "run_dir": str(self.run_dir),
            "candidates": None if self.candidates is None else str(self.candidates),
        }

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainingTask:
        candidates = values["candidates"]
        return cls(
            values["kind"],
            Path(values["run_dir"]),
            None if candidates is None else Path(candidates),
        )
