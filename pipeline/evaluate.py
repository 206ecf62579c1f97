"""Retrieval evaluation against the whole catalogue through a FAISS index (paper §6.1, §6.5).

The catalogue is encoded with the model's entity tower (length-bucketed batches), indexed in
``index.num_shards`` FAISS shards and searched with each mention's query vectors, exactly as a
refresh does. Reported: recall@k (share of mentions with a correct entity among the top k; a
mention may have several correct entities, ``golds``), accuracy (= recall@1, "unnormalized
accuracy" in the Zeshel sense: every mention counts), micro over mentions and Zeshel-style macro
averages over domains (the mean of per-domain figures).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from cluster.checkpoints import resolve_checkpoint
from cluster.encoder_pool import encode_entity_texts
from cluster.miner import search_mentions
from cluster.sharded_index import IndexShard, IndexSpec, ShardedSearcher, build_shard_index
from cluster.tables import EntityCatalogue, Mention, MentionSplit, mention_split_path
from encoders.biencoder import BiEncoder, load_biencoder
from pipeline.config import Config
from pipeline.preflight import check_eval_inputs
from pipeline.train.model import build_model


@dataclass
class RecallReport:
    """Recall@k micro (over mentions) and macro (over domains), with per-domain figures."""

    name: str
    num_mentions: int
    num_entities: int
    recall: dict[int, float]
    macro_recall: dict[int, float]
    per_domain: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def accuracy(self) -> float:
        return self.recall[1] if 1 in self.recall else float("nan")

    @property
    def macro_accuracy(self) -> float:
        return self.macro_recall[1] if 1 in self.macro_recall else float("nan")

    def to_json(self) -> dict[str, object]:
        payload = asdict(self)
        payload["accuracy"] = self.accuracy
        payload["macro_accuracy"] = self.macro_accuracy
        return payload


def hits_at(
    candidates: np.ndarray, golds: Sequence[Sequence[int]], ks: Sequence[int]
) -> np.ndarray:
    """Bool [M, len(ks)]: does row i hold a correct entity among its first k candidates?"""
    first_hit = np.full(len(golds), np.iinfo(np.int64).max, dtype=np.int64)
    for row, correct in enumerate(golds):
        positions = np.flatnonzero(np.isin(candidates[row], np.asarray(correct, np.int64)))
        if positions.size:
            first_hit[row] = positions[0]
    return np.stack([first_hit < k for k in ks], axis=1)


def summarise(
    name: str,
    hits: np.ndarray,
    domains: Sequence[str],
    ks: Sequence[int],
    num_entities: int,
) -> RecallReport:
    """Micro and macro (over domains) recall from a hit matrix."""
    recall = {k: float(hits[:, j].mean()) if len(hits) else 0.0 for j, k in enumerate(ks)}
    domain_array = np.asarray(domains)
    per_domain: dict[str, dict[str, float]] = {}
    for domain in sorted(set(domains)):
        rows = domain_array == domain
        per_domain[domain] = {"mentions": float(rows.sum())}
        per_domain[domain].update(
            {f"recall@{k}": float(hits[rows, j].mean()) for j, k in enumerate(ks)}
        )
    macro = {
        k: float(np.mean([figures[f"recall@{k}"] for figures in per_domain.values()]))
        if per_domain
        else 0.0
        for k in ks
    }
    return RecallReport(name, len(hits), num_entities, recall, macro, per_domain)


def encode_catalogue(
    model: BiEncoder,
    catalogue: EntityCatalogue,
    batch_size: int,
    max_entities: int = 0,
    progress: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Index vectors [V, d] of the catalogue (or its first ``max_entities``) and their entity ids."""
    total = len(catalogue) if max_entities <= 0 else min(max_entities, len(catalogue))
    chunk = max(batch_size * 16, 1024)
    vectors, ids = [], []
    seen = 0
    bar = tqdm(total=total, desc="encode catalogue", unit="entity", disable=not progress)
    for record_batch in catalogue.iter_batches(chunk, columns=["entity_id", "title", "text"]):
        if seen >= total:
            break
        take = min(record_batch.num_rows, total - seen)
        entity_ids = record_batch.column("entity_id").to_numpy()[:take]
        titles = record_batch.column("title").to_pylist()[:take]
        texts = record_batch.column("text").to_pylist()[:take]
        chunk_vectors, rows, _ = encode_entity_texts(model, titles, texts, batch_size)
        vectors.append(chunk_vectors)
        ids.append(entity_ids[rows])
        seen += take
        bar.update(take)
    bar.close()
    return np.concatenate(vectors), np.concatenate(ids).astype(np.int64)


def build_index(
    vectors: np.ndarray,
    ids: np.ndarray,
    spec: IndexSpec,
    num_shards: int,
    vectors_per_entity: int | None,
) -> ShardedSearcher:
    """``num_shards`` FAISS shards over the vectors, searched with a heap merge."""
    num_shards = max(1, min(num_shards, len(ids)))
    shards = [
        IndexShard(build_shard_index(np.ascontiguousarray(part_vectors), spec), part_ids)
        for part_vectors, part_ids in zip(
            np.array_split(vectors, num_shards), np.array_split(ids, num_shards), strict=True
        )
    ]
    return ShardedSearcher(shards, vectors_per_entity=vectors_per_entity)


def evaluate_model(
    name: str,
    model: BiEncoder,
    catalogue: EntityCatalogue,
    mentions: Sequence[Mention],
    ks: Sequence[int],
    batch_size: int = 256,
    spec: IndexSpec | None = None,
    num_shards: int = 1,
    max_entities: int = 0,
    per_domain_catalogue: bool = False,
    progress: bool = True,
) -> RecallReport:
    """Recall@ks of ``model`` on ``mentions`` against the catalogue through a FAISS index.

    ``per_domain_catalogue`` searches each mention among its own domain's entities only (Zeshel:
    a test world is linked against that world's documents); otherwise the whole catalogue.
    """
    model.eval()
    spec = spec or IndexSpec()
    vectors_per_entity = model.scorer.vectors_per_entity
    candidates = np.full((len(mentions), max(ks)), -1, dtype=np.int64)
    with torch.inference_mode():
        vectors, ids = encode_catalogue(model, catalogue, batch_size, max_entities, progress)
        if per_domain_catalogue:
            entity_domains = np.asarray(catalogue.domain_of().to_numpy(zero_copy_only=False))
            mention_domains = np.asarray([m.domain for m in mentions])
            for domain in sorted(set(mention_domains.tolist())):
                keep = entity_domains[ids] == domain
                rows = np.flatnonzero(mention_domains == domain)
                if not keep.any():
                    continue
                searcher = build_index(
                    vectors[keep], ids[keep], spec, num_shards, vectors_per_entity
                )
                found, _ = search_mentions(
                    model, searcher, [mentions[i] for i in rows], max(ks), batch_size, progress
                )
                candidates[rows] = found
        else:
            searcher = build_index(vectors, ids, spec, num_shards, vectors_per_entity)
            candidates, _ = search_mentions(
                model, searcher, mentions, max(ks), batch_size, progress
            )
    golds = [m.golds or (m.gold,) for m in mentions]
    hits = hits_at(candidates, golds, ks)
    return summarise(name, hits, [m.domain for m in mentions], ks, len(np.unique(ids)))


def format_table(reports: Sequence[RecallReport], ks: Sequence[int] | None = None) -> str:
    """A plain-text table: one row per report, micro recall@k and macro accuracy."""
    ks = list(ks or sorted(reports[0].recall)) if reports else []
    headers = ["model", "mentions", "entities", *[f"R@{k}" for k in ks], "macro acc"]
    rows = [
        [
            report.name,
            str(report.num_mentions),
            str(report.num_entities),
            *[f"{report.recall[k]:.3f}" for k in ks],
            f"{report.macro_accuracy:.3f}",
        ]
        for report in reports
    ]
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]
    lines = [
        " | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in [headers, *rows]
    ]
    lines.insert(1, "-+-".join("-" * width for width in widths))
    return "\n".join(lines)


def write_reports(reports: Sequence[RecallReport], path: Path) -> None:
    """JSON: a list of reports (micro, macro and per-domain figures)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([report.to_json() for report in reports], indent=2) + "\n")


def evaluate_checkpoint(config: Config, checkpoint: str, progress: bool = True) -> RecallReport:
    """Recall of a run's checkpoint (``newest``, a ``step-<S>/`` or ``export/`` directory, or
    ``untrained``: ``model.path`` itself) on ``data.eval_split``."""
    check_eval_inputs(config)
    if checkpoint == "untrained":
        model, name = build_model(config), f"untrained {config.model.path}"
    else:
        _, export = resolve_checkpoint(config.run_dir, checkpoint)
        model, name = load_biencoder(export), str(export.parent)
    root = Path(config.data.root)
    mentions = MentionSplit.open(mention_split_path(root, config.data.eval_split)).read_all()
    limit = config.data.max_eval_mentions
    mentions = mentions[:limit] if limit > 0 else mentions
    return evaluate_model(
        name,
        model,
        EntityCatalogue.open(root),
        mentions,
        config.eval.ks,
        config.eval.batch_size,
        max_entities=config.eval.max_entities,
        per_domain_catalogue=config.eval.per_domain_catalogue,
        progress=progress,
    )
