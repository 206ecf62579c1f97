"""What training and inference share about a run: its directory's names, the task kinds, and
what its refreshes do.

``hnce train`` and ``hnce rerank`` write a run directory; ``hnce eval``, the linker, ``hnce
status`` and ``hnce refresh`` read it. What both sides need lives here, below the trainer
(``hnce.pipeline.train``), so that nothing that only reads or searches a run imports the trainer:

- :data:`RUN_RECIPE`: the resolved recipe the trainer writes into the run directory;
- :data:`TaskKind`, :data:`RERANK_DIR` and :func:`rerank_run_dir`: the two tasks the shared
  driver trains, and where the reranker's run lives (``<run>/rerank``);
- :func:`refresh_plan`: what a run's refreshes do, for the coordinator, ``hnce refresh``,
  version 0 and every search of an index version (``hnce.cluster.compute.retrieval``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from hnce.cluster.compute.heldout import HeldoutSpec
from hnce.cluster.compute.refresh import RefreshPlan
from hnce.pipeline.config import Config

RUN_RECIPE = "config.yaml"  # the resolved recipe `hnce train` writes into its run directory

TaskKind = Literal["retriever", "reranker"]
RERANK_DIR = "rerank"


def rerank_run_dir(config: Config) -> Path:
    """``<run.dir>/rerank``: the reranker's checkpoints, event log, candidates and reports."""
    return (config.run_dir / RERANK_DIR).resolve()


def refresh_plan(config: Config) -> RefreshPlan:
    """What this run's refreshes do: its directories, the ``refresh`` and ``index`` sections,
    and, with ``refresh.heldout_recall``, the held-out mentions each scores as ``hnce eval``."""
    heldout = HeldoutSpec(
        split=config.data.eval_split,
        max_mentions=config.data.max_eval_mentions,
        ks=tuple(config.eval.ks),
        per_domain=config.eval.per_domain_catalogue,
        batch_size=config.eval.batch_size,
    )
    return RefreshPlan(
        run_dir=config.run_dir.resolve(),
        data_dir=Path(config.data.root).resolve(),
        refresh=config.refresh,
        index=config.index,
        heldout=heldout if config.refresh.heldout_recall else None,
    )
