"""Joint reranker: train the cross-encoder on a fixed retriever's candidates, report accuracy.

Paper §6.3 ("Training a reranker") and Appendix B: the joint encoder s(x, y) = wᵀ BERT([x ; y])
(DESIGN.md §3) is trained by minimising the hard-negative NCE loss (eq. 11) with the top-63
negatives of a *fixed* retriever, then reranks that retriever's top-64 candidates. Reported, per
domain and macro-averaged over domains as in the paper's Table 2 / Appendix B:

- normalized accuracy: accuracy over the mentions whose gold is among the top 64 (the reranking
  problem proper);
- unnormalized accuracy: over all mentions; a mention whose gold is not retrieved, or is missing
  from the catalogue (``gold = MISSING_GOLD``), counts as an error.

Candidates come from a negatives version (``<run>/negatives/v<N>/<split>.parquet``, the raw top-N
of an index version) or from searching the retriever itself through the cluster
(:func:`retrieve_candidates`, in the run's index version of that checkpoint or one built for
it). The
training engine is DeepSpeed, configured by ``pipeline.train.deepspeed_config`` as the
bi-encoder trainer; a single process with the gloo backend is enough on a CPU.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import deepspeed
import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn
from tqdm import tqdm

from cluster.checkpoints import resolve_checkpoint
from cluster.index_build import IndexedModel
from cluster.negatives_store import NegativesStore, NegativesVersion
from cluster.refresh import RefreshPlan
from cluster.retrieval import retrieve
from cluster.session import init_ray
from cluster.tables import EntityCatalogue, Mention, MentionSplit, mention_split_path
from encoders.blink import export_blink_crossencoder
from encoders.reranker import JointReranker, build_reranker, export_reranker
from pipeline.config import Config, TrainingSettings
from pipeline.preflight import check_rerank_inputs, model_directory
from pipeline.train.deepspeed_config import build_deepspeed_config
from pipeline.train.trainer import refresh_plan

NUM_CANDIDATES = 64  # paper: top-64 candidates, i.e. the gold and the top-63 negatives


@dataclass
class SplitCandidates:
    """A mention split with its retriever's candidates, best first (-1 where fewer exist)."""

    mentions: list[Mention]
    cands: np.ndarray  # int64 [M, N]

    def __post_init__(self) -> None:
        if self.cands.ndim != 2 or self.cands.shape[0] != len(self.mentions):
            raise ValueError(
                f"{len(self.mentions)} mentions but candidates of shape {self.cands.shape}"
            )


def candidates_from_negatives(
    version: NegativesVersion, mentions: Sequence[Mention]
) -> SplitCandidates:
    """The candidates a negatives version holds for ``mentions`` (KeyError naming a missing one)."""
    cand_ids, _ = version.lookup([m.mention_id for m in mentions])
    return SplitCandidates(list(mentions), cand_ids.numpy())


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
    progress: bool = True,
) -> SplitCandidates:
    """Top-``k`` candidates of ``mentions`` under ``retriever``, through the cluster: searched in
    the run's index version of that model, or one built for it (``cluster.retrieval``)."""
    found = retrieve(plan, retriever, mentions, k, progress=progress)
    return SplitCandidates(list(mentions), found.cands)


def correct_sets(mentions: Sequence[Mention]) -> list[set[int]]:
    """Correct entity ids of each mention (``golds``, or ``gold``); empty when the gold is missing."""
    return [{g for g in (m.golds or (m.gold,)) if g >= 0} for m in mentions]


def training_candidates(
    split: SplitCandidates, num_candidates: int = NUM_CANDIDATES
) -> tuple[list[Mention], np.ndarray, np.ndarray]:
    """Rows for eq. 11: (mentions, ids [M, num_candidates] with the gold in column 0 followed by
    the retriever's top non-gold candidates, valid [M, num_candidates]).

    Known positives (every entity in ``golds``) never serve as negatives; mentions whose gold is
    missing from the catalogue cannot be trained on and are left out; rows with fewer than
    ``num_candidates - 1`` negatives are padded and masked (``valid`` False).
    """
    keep, rows, masks = [], [], []
    for mention, cands, correct in zip(
        split.mentions, split.cands, correct_sets(split.mentions), strict=True
    ):
        if mention.gold < 0:
            continue
        negatives = [int(c) for c in cands if c >= 0 and int(c) not in correct]
        negatives = negatives[: num_candidates - 1]
        pad = num_candidates - 1 - len(negatives)
        rows.append([mention.gold, *negatives, *([mention.gold] * pad)])
        masks.append([True] * (1 + len(negatives)) + [False] * pad)
        keep.append(mention)
    ids = np.asarray(rows, dtype=np.int64).reshape(-1, num_candidates)
    return keep, ids, np.asarray(masks, dtype=bool).reshape(-1, num_candidates)


def nce_loss(scores: Tensor, valid: Tensor) -> Tensor:
    """Hard-negative NCE (eq. 5/11) with the gold in column 0:
    J = −log exp s(x,y) / (exp s(x,y) + Σ_k exp s(x,y_k)), padded negatives masked out."""
    masked = scores.masked_fill(~valid, float("-inf"))
    return nn.functional.cross_entropy(masked, torch.zeros(len(scores), dtype=torch.long))


class PairScoring(nn.Module):
    """What DeepSpeed's engine wraps: scores [B, N] of each mention against its own candidates."""

    def __init__(self, reranker: JointReranker) -> None:
        super().__init__()
        self.reranker = reranker

    def forward(
        self, mention_batch: Mapping[str, Tensor], candidate_batch: Mapping[str, Tensor]
    ) -> Tensor:
        return self.reranker.score_candidates(mention_batch, candidate_batch)


def _pair_batch(
    reranker: JointReranker,
    catalogue: EntityCatalogue,
    mentions: Sequence[Mention],
    cand_ids: np.ndarray,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Tokenised mentions [B, Lm] and candidates [B, N, Le] for the cross-encoder."""
    entities = catalogue.get_many(cand_ids.reshape(-1).tolist())
    mention_batch = reranker.tokenize_mentions(
        [m.context_left for m in mentions],
        [m.mention for m in mentions],
        [m.context_right for m in mentions],
    )
    entity_batch = reranker.tokenize_entities(
        [e.title for e in entities], [e.text for e in entities]
    )
    candidate_batch = {
        key: value.reshape(len(mentions), cand_ids.shape[1], -1)
        for key, value in entity_batch.items()
        if key in ("input_ids", "attention_mask")
    }
    return mention_batch, candidate_batch


def init_single_process() -> None:
    """A one-process group (gloo on CPU, nccl on a GPU) for DeepSpeed when none exists yet."""
    if dist.is_available() and dist.is_initialized():
        return
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(name, value)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(probe.getsockname()[1])
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")


@dataclass
class RerankTrainingLog:
    """Loss per optimizer step (mean over its micro-batches) and the mentions trained on."""

    losses: list[float] = field(default_factory=list)
    train_mentions: int = 0
    skipped_missing_gold: int = 0


def train_reranker(
    reranker: JointReranker,
    catalogue: EntityCatalogue,
    train: SplitCandidates,
    settings: TrainingSettings,
    num_candidates: int = NUM_CANDIDATES,
    seed: int = 0,
    progress: bool = True,
) -> RerankTrainingLog:
    """Train ``reranker`` in place with DeepSpeed on eq. 11 over the gold + top-(N−1) negatives.

    ``settings.steps`` optimizer steps of ``gradient_accumulation`` micro-batches of
    ``batch_size`` mentions; mentions are visited in a seeded random order, epoch after epoch.
    """
    mentions, cand_ids, valid = training_candidates(train, num_candidates)
    log = RerankTrainingLog(
        train_mentions=len(mentions), skipped_missing_gold=len(train.mentions) - len(mentions)
    )
    if not mentions:
        raise ValueError("no training mention has its gold in the catalogue")
    init_single_process()
    on_gpu = torch.cuda.is_available()
    module = PairScoring(reranker)
    engine, _, _, _ = deepspeed.initialize(
        model=module,
        model_parameters=[p for p in module.parameters() if p.requires_grad],
        config=build_deepspeed_config(settings, on_gpu),
    )
    device = engine.device
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(mentions))
    cursor = 0
    engine.train()
    for _ in tqdm(range(settings.steps), desc="rerank training", unit="step", disable=not progress):
        losses = []
        for _ in range(settings.gradient_accumulation):
            if cursor + settings.batch_size > len(order):
                order, cursor = rng.permutation(len(mentions)), 0
            rows = order[cursor : cursor + settings.batch_size]
            cursor += len(rows)
            mention_batch, candidate_batch = _pair_batch(
                reranker, catalogue, [mentions[i] for i in rows], cand_ids[rows]
            )
            scores = engine(
                {k: v.to(device) for k, v in mention_batch.items()},
                {k: v.to(device) for k, v in candidate_batch.items()},
            ).float()
            loss = nce_loss(scores.cpu(), torch.from_numpy(valid[rows]))
            engine.backward(loss)
            engine.step()
            losses.append(float(loss.detach()))
        log.losses.append(sum(losses) / len(losses))
    reranker.eval()
    return log


@torch.inference_mode()
def rerank(
    reranker: JointReranker,
    catalogue: EntityCatalogue,
    split: SplitCandidates,
    num_candidates: int = NUM_CANDIDATES,
    batch_size: int = 4,
    progress: bool = True,
) -> np.ndarray:
    """Candidate ids [M, num_candidates] reordered by the reranker's scores (-1 stays last)."""
    reranker.eval()
    device = next(reranker.parameters()).device
    cands = split.cands[:, :num_candidates]
    out = np.full_like(cands, -1)
    for start in tqdm(
        range(0, len(cands), batch_size), desc="rerank", unit="batch", disable=not progress
    ):
        block = cands[start : start + batch_size]
        present = block >= 0
        mention_batch, candidate_batch = _pair_batch(
            reranker,
            catalogue,
            split.mentions[start : start + batch_size],
            np.where(present, block, 0),
        )
        scores = reranker.score_candidates(
            {k: v.to(device) for k, v in mention_batch.items()},
            {k: v.to(device) for k, v in candidate_batch.items()},
        ).float()
        scores = scores.cpu().masked_fill(~torch.from_numpy(present), float("-inf"))
        order = torch.argsort(scores, dim=1, descending=True, stable=True).numpy()
        reordered = np.take_along_axis(block, order, axis=1)
        out[start : start + len(block)] = reordered
    return out


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
        domains = list(self.per_domain.values())
        return {
            name: float(np.mean([getattr(d, name) for d in domains])) if domains else 0.0
            for name in MACRO_FIELDS
        }

    def to_json(self) -> dict[str, object]:
        return {
            "split": self.split,
            "num_candidates": self.num_candidates,
            "overall": self.overall.to_json(),
            "macro": self.macro,
            "per_domain": {name: f.to_json() for name, f in self.per_domain.items()},
        }


def _figures(
    mentions: Sequence[Mention], retrieved: np.ndarray, reranked: np.ndarray, rows: np.ndarray
) -> AccuracyFigures:
    correct = correct_sets(mentions)
    hit_any = missing = first = rerank_first = 0
    for row in rows:
        golds = correct[row]
        hit_any += int(any(int(c) in golds for c in retrieved[row] if c >= 0))
        first += int(retrieved[row, 0] >= 0 and int(retrieved[row, 0]) in golds)
        rerank_first += int(reranked[row, 0] >= 0 and int(reranked[row, 0]) in golds)
        missing += int(not golds)
    return AccuracyFigures(
        mentions=len(rows),
        missing_gold=missing,
        retrieved=hit_any,
        retriever_correct=first,
        reranker_correct=rerank_first,
    )


def accuracy_report(
    split_name: str, split: SplitCandidates, reranked: np.ndarray, num_candidates: int
) -> RerankReport:
    """Normalized / unnormalized accuracy of the reranker (and of the retriever alone) on the
    top-``num_candidates``, per domain and macro-averaged."""
    retrieved = split.cands[:, :num_candidates]
    domains = np.asarray([m.domain for m in split.mentions])
    per_domain = {
        domain: _figures(split.mentions, retrieved, reranked, np.flatnonzero(domains == domain))
        for domain in sorted(set(domains.tolist()))
    }
    overall = _figures(split.mentions, retrieved, reranked, np.arange(len(split.mentions)))
    return RerankReport(split_name, num_candidates, overall, per_domain)


def format_reports(reports: Sequence[RerankReport]) -> str:
    """A Table 2-style text table: per split, domains then micro and macro rows."""
    depth = reports[0].num_candidates if reports else NUM_CANDIDATES
    headers = ["split", "domain", "mentions", "missing gold", f"R@{depth}", "retriever acc"]
    headers += ["normalized acc", "unnormalized acc"]
    lines = []
    for report in reports:
        rows = [(name, f) for name, f in report.per_domain.items() if len(report.per_domain) > 1]
        for name, figures in [*rows, ("(micro)", report.overall)]:
            lines.append(
                [
                    report.split,
                    name or "(all)",
                    str(figures.mentions),
                    str(figures.missing_gold),
                    f"{figures.recall:.4f}",
                    f"{figures.retriever_unnormalized:.4f}",
                    f"{figures.normalized:.4f}",
                    f"{figures.unnormalized:.4f}",
                ]
            )
        macro = report.macro
        lines.append(
            [
                report.split,
                "(macro)",
                "",
                "",
                f"{macro['recall']:.4f}",
                f"{macro['retriever_unnormalized']:.4f}",
                f"{macro['normalized']:.4f}",
                f"{macro['unnormalized']:.4f}",
            ]
        )
    widths = [max(len(row[i]) for row in [headers, *lines]) for i in range(len(headers))]
    text = [" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in lines]
    head = " | ".join(c.ljust(w) for c, w in zip(headers, widths, strict=True))
    return "\n".join([head, "-+-".join("-" * w for w in widths), *text])


def write_reports(reports: Sequence[RerankReport], log: RerankTrainingLog, path: Path) -> None:
    """JSON with every split's report and the training log."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"training": asdict(log), "splits": [r.to_json() for r in reports]}
    path.write_text(json.dumps(payload, indent=2) + "\n")


def _split_candidates(
    config: Config, split: str, limit: int, retriever: IndexedModel | None, progress: bool
) -> SplitCandidates:
    mentions = MentionSplit.open(mention_split_path(Path(config.data.root), split)).read_all()
    mentions = mentions[:limit] if limit > 0 else mentions
    if retriever is None:
        negatives = config.run_dir / "negatives"
        return candidates_from_negatives(latest_negatives(negatives, split), mentions)
    return retrieve_candidates(
        refresh_plan(config), retriever, mentions, config.rerank.num_candidates, progress
    )


def run_rerank_job(
    config: Config, progress: bool = True
) -> tuple[list[RerankReport], RerankTrainingLog, Path]:
    """Train the joint reranker on the train split's candidates, rerank every eval split, write
    ``<run>/rerank/reranker/`` (HF export), ``crossencoder_blink.bin`` (BLINK's cross-encoder
    layout) and ``rerank_report.json``; returns the reports, the training log and that directory."""
    check_rerank_inputs(config)
    settings = config.rerank
    torch.manual_seed(config.run.seed)
    catalogue = EntityCatalogue.open(Path(config.data.root))
    retriever = None
    if settings.candidates == "retriever":
        step, export = resolve_checkpoint(config.run_dir, settings.retriever)
        retriever = IndexedModel.from_checkpoint(export.parent, step)
        init_ray(config.cluster, config.refresh.num_encoders * config.refresh.encoder_cpus)
    reranker = build_reranker(
        model_directory(config, "rerank.model", settings.model),
        mention_length=settings.mention_length,
        entity_length=settings.entity_length,
    )
    train = _split_candidates(
        config, config.data.train_split, settings.max_train_mentions, retriever, progress
    )
    log = train_reranker(
        reranker,
        catalogue,
        train,
        settings.training,
        settings.num_candidates,
        config.run.seed,
        progress,
    )
    reports = []
    for split in settings.eval_splits:
        candidates = _split_candidates(
            config, split, settings.max_eval_mentions, retriever, progress
        )
        reranked = rerank(
            reranker,
            catalogue,
            candidates,
            settings.num_candidates,
            settings.eval_batch_size,
            progress,
        )
        reports.append(accuracy_report(split, candidates, reranked, settings.num_candidates))
    out = config.run_dir / "rerank"
    export_reranker(reranker, out / "reranker")
    export_blink_crossencoder(reranker, out / "crossencoder_blink.bin")
    write_reports(reports, log, out / "rerank_report.json")
    return reports, log, out
