"""What training and inference share about a run: its directory's names, the task kinds, and
what its refreshes do.

``hnce train`` and ``hnce rerank`` write a run directory; ``hnce eval``, the linker, ``hnce
status`` and ``hnce refresh`` read it. What both sides need lives here, below the trainer
(``hnce.pipeline.train``), so that nothing that only reads or searches a run imports the trainer:

- :data:`RUN_RECIPE`: the resolved recipe the trainer writes into the run directory;
- :data:`TaskKind`, :data:`RERANK_DIR` and :func:`rerank_run_dir`: the two tasks the shared
  driver trains, and where the reranker's run lives (``<run>/rerank``);
- :func:`refresh_plan`: what a run's refreshes do, for the coordinator, ``hnce refresh``,
  the initial negatives and every search of an index version (``hnce.cluster.compute.retrieval``);
- :data:`RUN_STORES` and :func:`refuse_inside_stores`: the directories only hnce writes, where
  no output a user names may land.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from hnce.cluster.compute.miner import SEARCH_BATCH
from hnce.cluster.compute.refresh.heldout import HeldoutSpec
from hnce.cluster.compute.refresh.plan import RefreshPlan
from hnce.cluster.compute.retrieval import EVAL_INDEX_DIR
from hnce.cluster.stores.checkpoints import CHECKPOINTS_DIR
from hnce.cluster.stores.index_store import INDEX_DIR
from hnce.cluster.stores.negatives_store import NEGATIVES_DIR
from hnce.errors import InputError
from hnce.pipeline.config import Config

RUN_RECIPE = "config.yaml"  # the resolved recipe `hnce train` writes into its run directory

TaskKind = Literal["retriever", "reranker"]
RERANK_DIR = "rerank"
#: a run directory's stores: versions hnce publishes and verifies (a checkpoint's files are
#: checked against its COMPLETE marker, an index's against its manifest), so a file a user's
#: output put there would make the version fail verification or be taken for part of it
RUN_STORES = (CHECKPOINTS_DIR, INDEX_DIR, NEGATIVES_DIR, EVAL_INDEX_DIR)


def refuse_inside_stores(out: Path, run_dir: Path, option: str) -> None:
    """Raise :class:`InputError` naming ``option`` when ``out`` lies (once resolved) inside one
    of ``run_dir``'s :data:`RUN_STORES`; anywhere else, the run directory included, is the
    user's to choose."""
    target = Path(out).resolve()
    for store in RUN_STORES:
        directory = (Path(run_dir) / store).resolve()
        if target.is_relative_to(directory):
            raise InputError(
                f"{option} {out}: lies inside the run's {store}/ ({directory}), which hnce "
                f"alone writes and verifies; choose a path outside it"
            )


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
        batch_size=SEARCH_BATCH,
    )
    return RefreshPlan(
        run_dir=config.run_dir.resolve(),
        data_dir=Path(config.data.root).resolve(),
        refresh=config.refresh,
        index=config.index,
        heldout=heldout if config.refresh.heldout_recall else None,
    )
