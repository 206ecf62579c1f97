"""Held-out recall of each refresh: the eval split scored against the index version the refresh
has just built and holds (docs/refresh.md).

A refresh already holds a fresh index of the whole catalogue in its encoder actors; scoring the
eval split's mentions against it costs only their encoding and search, the same search and the
same recall as ``hnce eval`` of that checkpoint (which reuses the version), so both report equal
figures. ``refresh.heldout_recall`` turns it on; the recipe's ``data`` and ``eval`` sections say
which mentions and cut-offs (:class:`HeldoutSpec`, filled in by the pipeline).

Example::

    heldout = score_heldout(spec, data_dir, pool, held, version, step=40)
    heldout.line()       # refresh v3 (step 40): held-out R@1 0.450 R@64 0.970 (...)
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from hnce.cluster.compute.encoder_pool import EncoderPool
from hnce.cluster.compute.miner import search_catalogue
from hnce.cluster.compute.recall import recall_report
from hnce.cluster.compute.shard_holders import HeldIndex
from hnce.cluster.stores.index_store import IndexVersion
from hnce.cluster.stores.refresh_log import HeldoutRecall
from hnce.cluster.stores.tables import Mention, mention_split_path
from hnce.cluster.stores.tables_read import MentionSplit

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeldoutSpec:
    """Which mentions a refresh scores and how, as ``hnce eval`` does.

    Attributes:
        split: the mention split (``data.eval_split``).
        max_mentions: its first mentions only (``data.max_eval_mentions``; 0: all).
        ks: recall cut-offs (``eval.ks``).
        per_domain: search each mention within its own domain (``eval.per_domain_catalogue``).
        batch_size: mentions per search batch (``hnce.cluster.compute.miner.SEARCH_BATCH``).
    """

    split: str
    max_mentions: int
    ks: tuple[int, ...]
    per_domain: bool
    batch_size: int


def eval_mentions(data_dir: Path, split: str, max_mentions: int) -> list[Mention]:
    """The first ``max_mentions`` mentions of ``split`` (0: all), as evaluation reads them."""
    mentions = MentionSplit.open(mention_split_path(data_dir, split)).read_all()
    return mentions[:max_mentions] if max_mentions > 0 else mentions


def training_golds(data_dir: Path, split: str) -> set[int] | None:
    """Every entity a mention of the training ``split`` links to; None when there is no such
    split (recall is then not told apart for seen and unseen entities)."""
    path = mention_split_path(data_dir, split)
    if not path.is_file():
        return None
    return {int(g) for m in MentionSplit.open(path).read_all() for g in (m.golds or (m.gold,))}


def score_heldout(
    spec: HeldoutSpec,
    data_dir: Path,
    pool: EncoderPool,
    held: HeldIndex,
    version: IndexVersion,
    step: int,
) -> HeldoutRecall | None:
    """Recall@``spec.ks`` of ``spec.split`` against ``held`` (index ``version`` of checkpoint
    ``step``), encoded by ``pool``; None, with one log line, when the dataset has no such split."""
    path = mention_split_path(data_dir, spec.split)
    if not path.is_file():
        logger.info("held-out recall skipped: the dataset has no %r split (%s)", spec.split, path)
        return None
    started = time.perf_counter()
    mentions = eval_mentions(data_dir, spec.split, spec.max_mentions)
    cands, _ = search_catalogue(
        pool, held, data_dir, mentions, max(spec.ks), spec.per_domain, spec.batch_size
    )
    report = recall_report(spec.split, cands, mentions, spec.ks, version.num_entities)
    return HeldoutRecall(
        step=step,
        index_version=version.version,
        split=spec.split,
        mentions=len(mentions),
        recall={str(k): value for k, value in report.recall.items()},
        seconds=time.perf_counter() - started,
        time=time.time(),
    )
