"""Retrieval evaluation against the whole catalogue through the cluster (paper §6.1, §6.5).

``hnce eval`` (:func:`evaluate_checkpoint`) and the demo (:func:`evaluate_export`, for a model's
export directory) search every mention among every entity with the cluster's encoder actors and
an index version of the evaluated model held by them (``hnce.cluster.compute.retrieval``): the version the
refresh published for that checkpoint when there is one, so evaluating the checkpoint the refresh
last indexed encodes nothing; else a version built once into ``<run>/eval-index/`` (never into
the refresh's store, so it cannot become live). The driver gets k candidates per mention and
never holds the catalogue's vectors.

Reported: recall@k (share of mentions with a correct entity among the top k; a mention may have
several correct entities, ``golds``), accuracy (= recall@1, "unnormalized accuracy" in the
Zeshel sense: every mention counts), micro over mentions and Zeshel-style macro averages over
domains (the mean of per-domain figures).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from hnce.cluster.compute.index_build import IndexedModel, model_fingerprint
from hnce.cluster.compute.retrieval import EVAL_INDEX_DIR, retrieve
from hnce.cluster.compute.session import init_ray
from hnce.cluster.stores.checkpoints import resolve_checkpoint
from hnce.cluster.stores.files import publish_directory
from hnce.cluster.stores.tables import mention_split_path
from hnce.cluster.stores.tables_read import MentionSplit
from hnce.encoders.biencoder import export_biencoder
from hnce.pipeline.blink_finetune.kilt_output import SplitResult, link_files
from hnce.pipeline.config import Config
from hnce.pipeline.preflight import check_eval_inputs
from hnce.pipeline.train.model import build_model
from hnce.pipeline.train.refresh_supervisor import refresh_plan

logger = logging.getLogger(__name__)

PREDICTIONS_DIR = "predictions"


@dataclass
class RecallReport:
    """Recall@k micro (over mentions) and macro (over domains), with per-domain figures."""

    name: str
    num_mentions: int
    num_entities: int
    recall: dict[int, float]
    macro_recall: dict[int, float]
    per_domain: dict[str, dict[str, float]] = field(default_factory=dict)
    index: str = ""  # the index version searched

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


def untrained_export(config: Config) -> Path:
    """``model.path`` with the recipe's scorer, exported once under
    ``<run>/eval-index/models/<fingerprint>/`` so the encoder actors can load it and an index
    built for it is found again (the fingerprint is of the exported files). Weights the
    model directory does not give (e.g. poly codes) are drawn from ``run.seed``, as the training
    workers draw them, so this is the model a run starts from."""
    with torch.random.fork_rng():
        torch.manual_seed(config.run.seed)
        model = build_model(config)
    root = config.run_dir / EVAL_INDEX_DIR / "models"
    root.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
    try:
        export_biencoder(model, building)
        target = root / model_fingerprint(building)[:16]
        if not target.exists():
            publish_directory(building, target)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return target


def evaluate_model(
    config: Config, model: IndexedModel, name: str, progress: bool = True
) -> RecallReport:
    """Recall@``eval.ks`` of ``model`` on ``data.eval_split`` against every entity, through the
    encoder pool and an index version of the model held by the actors (``hnce.cluster.compute.retrieval``:
    the refresh's own version when it indexed this model, else one built for evaluation)."""
    check_eval_inputs(config)
    init_ray(config.cluster, config.refresh.num_encoders * config.refresh.encoder_cpus)
    root = Path(config.data.root)
    mentions = MentionSplit.open(mention_split_path(root, config.data.eval_split)).read_all()
    limit = config.data.max_eval_mentions
    mentions = mentions[:limit] if limit > 0 else mentions
    retrieved = retrieve(
        refresh_plan(config),
        model,
        mentions,
        max(config.eval.ks),
        per_domain=config.eval.per_domain_catalogue,
        batch_size=config.eval.batch_size,
        progress=progress,
    )
    version = retrieved.index_version
    logger.info(
        "evaluated %s with index v%d of %s (%s); %s",
        name,
        version.version,
        version.path.parent,
        "built for this evaluation" if retrieved.built else "reused",
        ", ".join(f"{stage} {value:.1f}s" for stage, value in retrieved.seconds.items()),
    )
    golds = [m.golds or (m.gold,) for m in mentions]
    hits = hits_at(retrieved.cands, golds, config.eval.ks)
    report = summarise(
        name, hits, [m.domain for m in mentions], config.eval.ks, version.num_entities
    )
    report.index = str(version.path)
    return report


def evaluate_export(
    config: Config, export_dir: Path, name: str | None = None, progress: bool = True
) -> RecallReport:
    """Recall of the bi-encoder exported in ``export_dir`` (e.g. a checkpoint's ``export/``)."""
    model = IndexedModel.from_export(Path(export_dir))
    return evaluate_model(config, model, name or str(export_dir), progress)


def resolve_model(config: Config, checkpoint: str) -> tuple[IndexedModel, str]:
    """(model, name) of a run's checkpoint: ``newest``, a ``step-<S>/`` or ``export/``
    directory, or ``untrained`` (``model.path`` itself with the recipe's scorer)."""
    if checkpoint == "untrained":
        model = IndexedModel.from_export(untrained_export(config))
        return model, f"untrained {config.model.path}"
    step, export = resolve_checkpoint(config.run_dir, checkpoint)
    return IndexedModel.from_checkpoint(export.parent, step), str(export.parent)


def evaluate_checkpoint(config: Config, checkpoint: str, progress: bool = True) -> RecallReport:
    """Recall of a run's checkpoint (:func:`resolve_model`) on ``data.eval_split``."""
    check_eval_inputs(config)
    model, name = resolve_model(config, checkpoint)
    return evaluate_model(config, model, name, progress)


def predict_checkpoint(
    config: Config, checkpoint: str, aida: Sequence[Path], progress: bool = True
) -> list[SplitResult]:
    """KILT predictions of a run's checkpoint (:func:`resolve_model`) for every input line of the
    ``aida`` files, into ``<run>/predictions/<file name>``, through the cluster like
    :func:`evaluate_model` (accuracy for the files with a labelled split of ``data.root``)."""
    check_eval_inputs(config)
    model, _ = resolve_model(config, checkpoint)
    init_ray(config.cluster, config.refresh.num_encoders * config.refresh.encoder_cpus)
    k = max(config.eval.ks)
    predictions = config.run_dir / PREDICTIONS_DIR
    return link_files(refresh_plan(config), model, aida, k, predictions, progress)
