"""Joint reranker: train the cross-encoder on a fixed retriever's candidates, report accuracy.

Paper §6.3 ("Training a reranker") and Appendix B: the joint encoder s(x, y) = wᵀ BERT([x ; y])
(docs/math.md) is trained by minimising the hard-negative NCE loss (eq. 11) with the top-63
negatives of a *fixed* retriever, then reranks that retriever's top-64 candidates. Reported, per
domain and macro-averaged over domains as in the paper's Table 2 / Appendix B:

- normalized accuracy: accuracy over the mentions whose gold is among the top 64 (the reranking
  problem proper);
- unnormalized accuracy: over all mentions; a mention whose gold is not retrieved, or is missing
  from the catalogue (``gold = MISSING_GOLD``), counts as an error.

Candidates come from a negatives version (``<run>/negatives/v<N>/<split>.parquet``, the raw top-N
of an index version) or from searching the retriever itself through the cluster
(:func:`retrieve_candidates`, in the run's index version of that checkpoint or one built for it).
This module is the reranker at inference (scoring, reranking, denoising, the accuracy report),
for the ``hnce rerank`` job (``hnce.pipeline.rerank_job``, which trains the reranker) and the
linker alike; it imports nothing of the trainer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from hnce.cluster.compute.index_build import IndexedModel
from hnce.cluster.compute.recall import (
    NOT_FOUND,
    by_domain,
    correct_sets,
    first_correct_rank,
    macro_average,
)
from hnce.cluster.compute.refresh.plan import RefreshPlan
from hnce.cluster.compute.retrieval import retrieve
from hnce.cluster.stores.negatives_store import MinedSplit, NegativesStore, NegativesVersion
from hnce.cluster.stores.tables import Mention
from hnce.cluster.stores.tokens import MentionTokens, TokenStore
from hnce.encoders.precision import autocast
from hnce.encoders.reranker import JointReranker
from hnce.mining.false_negatives import within_margin
from hnce.pipeline.metrics import text_table
from hnce.progress import progress_bar

logger = logging.getLogger(__name__)

NUM_CANDIDATES = 64  # paper: top-64 candidates, i.e. the gold and the top-63 negatives


def scoring_batch_size(training_batch_size: int) -> int:
    """Mentions (each with its candidates) a reranker scores per pass outside training: twice
    its training micro-batch (``rerank.training.batch_size``), which fits where that one did
    since no activations are kept for a backward pass."""
    return 2 * training_batch_size


@dataclass
class SplitCandidates:
    """A mention split with its retriever's candidates, best first (-1 where fewer exist)."""

    mentions: list[Mention]
    cands: np.ndarray  # int64 [M, N]
    scores: np.ndarray | None = None  # float32 [M, N], the retriever's

    def __post_init__(self) -> None:
        if self.cands.ndim != 2 or self.cands.shape[0] != len(self.mentions):
            raise ValueError(
                f"{len(self.mentions)} mentions but candidates of shape {self.cands.shape}"
            )
        if self.scores is not None and self.scores.shape != self.cands.shape:
            raise ValueError(f"candidates {self.cands.shape} but scores {self.scores.shape}")

    def mined(self) -> MinedSplit:
        """As a negatives-store split (scores required; gold ranks for diagnostics)."""
        if self.scores is None:
            raise ValueError("candidates without the retriever's scores cannot be stored")
        gold_ranks = np.full(len(self.mentions), -1, dtype=np.int32)
        rows, ranks = np.nonzero(self.cands == np.asarray([m.gold for m in self.mentions])[:, None])
        gold_ranks[rows] = ranks  # candidates of a row are distinct
        return MinedSplit(
            [m.mention_id for m in self.mentions], self.cands, self.scores, gold_ranks
        )


def candidates_from_negatives(
    version: NegativesVersion, mentions: Sequence[Mention]
) -> SplitCandidates:
    """The candidates a negatives version holds for ``mentions`` (KeyError naming a missing one)."""
    cand_ids, scores = version.lookup([m.mention_id for m in mentions])
    return SplitCandidates(list(mentions), cand_ids.numpy(), scores.numpy())


def latest_negatives(root: Path, split: str) -> NegativesVersion:
    """The newest negatives version of ``split`` under ``root`` (``<run>/negatives``)."""
    version = NegativesStore(root).latest(split)
    if version is None:
        raise FileNotFoundError(f"{root}: no published negatives version (no CURRENT)")
    return version


def retrieve_candidates(
    plan: RefreshPlan,
    retriever: IndexedModel,
    mentions: Sequence[Mention],
    k: int,
) -> SplitCandidates:
    """Top-``k`` candidates of ``mentions`` under ``retriever``, through the cluster: searched in
    the run's index version of that model, or one built for it (``hnce.cluster.compute.retrieval``)."""
    found = retrieve(plan, retriever, mentions, k)
    return SplitCandidates(list(mentions), found.cands, found.scores)


@torch.inference_mode()
def reranker_scores(
    reranker: JointReranker,
    store: TokenStore,
    mentions: Sequence[Mention],
    cands: np.ndarray,
    batch_size: int = 4,
) -> torch.Tensor:
    """The reranker's scores [M, N] of each mention with its candidates ``cands`` [M, N]
    (``-inf`` where a candidate is -1); entity tokens from the catalogue's token ``store``, bf16
    autocast on a GPU."""
    reranker.eval()
    device = next(reranker.parameters()).device
    logger.info("reranking %d mentions on %s", len(mentions), device)
    tokens = MentionTokens.tokenize(reranker, mentions)
    out = torch.full(cands.shape, float("-inf"))
    for start in progress_bar(range(0, len(cands), batch_size), desc="rerank", unit="batch"):
        block = cands[start : start + batch_size]
        present = block >= 0
        entities = store.batch(np.where(present, block, 0).reshape(-1))
        candidates = {
            key: value.reshape(*block.shape, -1).to(device) for key, value in entities.items()
        }
        mention_batch = tokens.batch(np.arange(start, start + len(block)))
        with autocast(device):
            scores = reranker.score_candidates(
                {key: value.to(device) for key, value in mention_batch.items()}, candidates
            )
        scores = scores.float().cpu().masked_fill(~torch.from_numpy(present), float("-inf"))
        out[start : start + len(block)] = scores
    return out


def rerank(
    reranker: JointReranker,
    store: TokenStore,
    split: SplitCandidates,
    num_candidates: int = NUM_CANDIDATES,
    batch_size: int = 4,
) -> tuple[np.ndarray, np.ndarray]:
    """Candidate ids [M, num_candidates] reordered by the reranker's scores (-1 stays last), and
    those scores float32 [M, num_candidates] in the same order (-inf at -1): a linker shows
    them beside the retriever's."""
    cands = split.cands[:, :num_candidates]
    scores = reranker_scores(reranker, store, split.mentions, cands, batch_size)
    order = torch.argsort(scores, dim=1, descending=True, stable=True).numpy()
    return (
        np.take_along_axis(cands, order, axis=1),
        np.take_along_axis(scores.numpy(), order, axis=1),
    )


def denoise(
    reranker: JointReranker,
    store: TokenStore,
    split: SplitCandidates,
    margin: float = 0.0,
    num_candidates: int = NUM_CANDIDATES,
    batch_size: int = 4,
) -> dict[str, list[int]]:
    """RocketQA's denoised hard negatives (Qu et al. 2021): per mention id, the candidates among
    its first ``num_candidates`` that the trained reranker scores within ``margin`` of the gold,
    s_R(x, y') > s_R(x, y) − margin (docs/math.md eq. (58), :func:`within_margin` on the
    reranker's scores). The gold is scored beside its candidates; a mention without a gold in
    the catalogue flags nothing."""
    gold = np.asarray([m.gold for m in split.mentions], dtype=np.int64)[:, None]
    cands = split.cands[:, :num_candidates]
    cands = np.where(cands == gold, -1, cands)  # the gold is scored once, in column 0
    scores = reranker_scores(
        reranker, store, split.mentions, np.concatenate([gold, cands], axis=1), batch_size
    )
    flagged = within_margin(scores[:, 1:], scores[:, 0], absolute_margin=margin)
    flagged &= torch.from_numpy((cands >= 0) & (gold >= 0))
    return {
        mention.mention_id: cands[row][flagged[row].numpy()].tolist()
        for row, mention in enumerate(split.mentions)
        if flagged[row].any()
    }


@dataclass
class AccuracyFigures:
    """Counts and accuracies of one domain (or of all mentions)."""

    mentions: int
    missing_gold: int  # gold not in the catalogue (counted as errors)
    retrieved: int  # gold among the top-N candidates
    retriever_correct: int  # gold at rank 1 of the retriever
    reranker_correct: int

    @property
    def recall(self) -> float:
        return self.retrieved / self.mentions if self.mentions else 0.0

    @property
    def normalized(self) -> float:
        """Reranker accuracy over mentions whose gold was retrieved."""
        return self.reranker_correct / self.retrieved if self.retrieved else 0.0

    @property
    def unnormalized(self) -> float:
        """Reranker accuracy over all mentions."""
        return self.reranker_correct / self.mentions if self.mentions else 0.0

    @property
    def retriever_normalized(self) -> float:
        return self.retriever_correct / self.retrieved if self.retrieved else 0.0

    @property
    def retriever_unnormalized(self) -> float:
        return self.retriever_correct / self.mentions if self.mentions else 0.0

    def to_json(self) -> dict[str, float | int]:
        return {
            **asdict(self),
            "recall": self.recall,
            "normalized_accuracy": self.normalized,
            "unnormalized_accuracy": self.unnormalized,
            "retriever_normalized_accuracy": self.retriever_normalized,
            "retriever_unnormalized_accuracy": self.retriever_unnormalized,
        }


MACRO_FIELDS = (
    "recall",
    "normalized",
    "unnormalized",
    "retriever_normalized",
    "retriever_unnormalized",
)


@dataclass
class RerankReport:
    """Table 2 / Appendix B figures of one split: per domain, micro over mentions, macro."""

    split: str
    num_candidates: int
    overall: AccuracyFigures
    per_domain: dict[str, AccuracyFigures]

    @property
    def macro(self) -> dict[str, float]:
        """Mean over domains of each per-domain figure (the paper's macro-averaged accuracy)."""
        return macro_average(self.per_domain, getattr, MACRO_FIELDS)

    def to_json(self) -> dict[str, object]:
        return {
            "split": self.split,
            "num_candidates": self.num_candidates,
            "overall": self.overall.to_json(),
            "macro": self.macro,
            "per_domain": {name: f.to_json() for name, f in self.per_domain.items()},
        }


def _figures(
    correct: list[set[int]], retrieved_rank: np.ndarray, reranked_rank: np.ndarray
) -> AccuracyFigures:
    return AccuracyFigures(
        mentions=len(correct),
        missing_gold=sum(1 for golds in correct if not golds),
        retrieved=int((retrieved_rank != NOT_FOUND).sum()),
        retriever_correct=int((retrieved_rank == 0).sum()),
        reranker_correct=int((reranked_rank == 0).sum()),
    )


def accuracy_report(
    split_name: str, split: SplitCandidates, reranked: np.ndarray, num_candidates: int
) -> RerankReport:
    """Normalized / unnormalized accuracy of the reranker (and of the retriever alone) on the
    top-``num_candidates``, per domain and macro-averaged."""
    golds = [m.golds or (m.gold,) for m in split.mentions]
    correct = correct_sets(golds)
    retrieved_rank = first_correct_rank(split.cands[:, :num_candidates], golds)
    reranked_rank = first_correct_rank(reranked, golds)
    per_domain = {
        domain: _figures([correct[row] for row in rows], retrieved_rank[rows], reranked_rank[rows])
        for domain, rows in by_domain([m.domain for m in split.mentions]).items()
    }
    overall = _figures(correct, retrieved_rank, reranked_rank)
    return RerankReport(split_name, num_candidates, overall, per_domain)


def _figure_cells(figures: AccuracyFigures | dict[str, float]) -> list[str]:
    value = figures.get if isinstance(figures, dict) else lambda name: getattr(figures, name)
    names = ("recall", "retriever_unnormalized", "normalized", "unnormalized")
    return [f"{value(name):.4f}" for name in names]


def format_reports(reports: Sequence[RerankReport]) -> str:
    """A Table 2-style text table: per split, domains then micro and macro rows."""
    depth = reports[0].num_candidates if reports else NUM_CANDIDATES
    headers = ["split", "domain", "mentions", "missing gold", f"R@{depth}", "retriever acc"]
    headers += ["normalized acc", "unnormalized acc"]
    rows = []
    for report in reports:
        domains = [(n, f) for n, f in report.per_domain.items() if len(report.per_domain) > 1]
        for name, figures in [*domains, ("(micro)", report.overall)]:
            counts = [str(figures.mentions), str(figures.missing_gold)]
            rows.append([report.split, name or "(all)", *counts, *_figure_cells(figures)])
        rows.append([report.split, "(macro)", "", "", *_figure_cells(report.macro)])
    return text_table(headers, rows)
