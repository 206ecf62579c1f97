"""``hnce rerank``: train the joint reranker on a fixed retriever's candidates, then rerank and
report with it (``hnce.pipeline.rerank``).

The train split's candidates come from the run's newest negatives version or from searching the
retriever itself (published under ``<run>/rerank/candidates`` for the workers). Training goes
through the same driver, worker loop and step as ``hnce train`` (``hnce.pipeline.train``, the reranker
task): DeepSpeed workers under Ray Train, resumable checkpoints under ``<run>/rerank/checkpoints``,
negatives the retriever's top non-positive candidates, token ids from the catalogue's token store.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from hnce.cluster.compute.index_build import IndexedModel
from hnce.cluster.compute.session import init_ray
from hnce.cluster.stores.checkpoints import resolve_checkpoint
from hnce.cluster.stores.denoised import denoised_path, write_denoised
from hnce.cluster.stores.negatives_store import NEGATIVES_DIR, NegativesStore, NegativesVersion
from hnce.cluster.stores.tables import mention_split_path
from hnce.cluster.stores.tables_read import EntityCatalogue, MentionSplit, catalogue_fingerprint
from hnce.cluster.stores.tokens import TokenStore
from hnce.cluster.stores.versioned_dir import next_version
from hnce.encoders.blink_checkpoint import export_blink_crossencoder
from hnce.encoders.reranker import JointReranker, load_reranker
from hnce.pipeline.config import Config
from hnce.pipeline.devices import local_device
from hnce.pipeline.metrics import write_json_report
from hnce.pipeline.preflight import check_rerank_inputs
from hnce.pipeline.rerank import (
    RerankReport,
    SplitCandidates,
    accuracy_report,
    candidates_from_negatives,
    denoise,
    latest_negatives,
    rerank,
    retrieve_candidates,
    scoring_batch_size,
)
from hnce.pipeline.run import refresh_plan, rerank_run_dir
from hnce.pipeline.train.task import TrainingTask
from hnce.pipeline.train.trainer import TrainingSummary, run_task

logger = logging.getLogger(__name__)


def write_reports(reports: Sequence[RerankReport], training: TrainingSummary, path: Path) -> None:
    """JSON with every split's report and what the training run did."""
    summary = asdict(training)
    summary["run_dir"] = str(training.run_dir)
    write_json_report(path, {"training": summary, "splits": [r.to_json() for r in reports]})


def _split_candidates(
    config: Config, split: str, limit: int, retriever: IndexedModel | None
) -> SplitCandidates:
    mentions = MentionSplit.open(mention_split_path(Path(config.data.root), split)).read_all()
    mentions = mentions[:limit] if limit > 0 else mentions
    if retriever is None:
        negatives = config.run_dir / NEGATIVES_DIR
        return candidates_from_negatives(latest_negatives(negatives, split), mentions)
    return retrieve_candidates(
        refresh_plan(config), retriever, mentions, config.rerank.num_candidates
    )


def training_candidates_file(
    config: Config,
    out: Path,
    retriever: IndexedModel | None,
) -> Path:
    """The negatives-version file the reranker's workers read the train split's candidates from:
    the run's newest version, or the retriever's top-N published under ``out/candidates``."""
    split = config.data.train_split
    if retriever is None:
        return latest_negatives(config.run_dir / NEGATIVES_DIR, split).path
    found = _split_candidates(config, split, 0, retriever)
    store = NegativesStore(out / "candidates")
    directory = store.publish(
        next_version(store.root),
        {split: found.mined()},
        checkpoint_step=retriever.checkpoint or 0,
        top_n=found.cands.shape[1],
        num_entities=len(EntityCatalogue.open(Path(config.data.root))),
        catalogue=catalogue_fingerprint(Path(config.data.root)),
    )
    return directory / f"{split}.parquet"


def write_false_negatives(
    config: Config,
    reranker: JointReranker,
    store: TokenStore,
    candidates_file: Path,
    reranker_step: int,
) -> Path:
    """``hnce rerank --denoise``: the train split's candidates in ``candidates_file`` (a
    negatives version) flagged by :func:`denoise` with ``rerank.denoise_margin``, written where
    ``negatives.candidates.denoised`` reads them (``hnce.cluster.stores.denoised``)."""
    data_root = Path(config.data.root)
    version = NegativesVersion(candidates_file)
    listed = set(version.mention_ids)
    split = MentionSplit.open(mention_split_path(data_root, config.data.train_split))
    mentions = [m for m in split.read_all() if m.mention_id in listed]
    settings = config.rerank
    pairs = denoise(
        reranker,
        store,
        candidates_from_negatives(version, mentions),
        settings.denoise_margin,
        settings.num_candidates,
        scoring_batch_size(settings.training.batch_size),
    )
    path = denoised_path(config.run_dir)
    write_denoised(
        path,
        pairs,
        settings.denoise_margin,
        version.version,
        reranker_step,
        len(EntityCatalogue.open(data_root)),
        catalogue_fingerprint(data_root),
    )
    flagged = sum(len(ids) for ids in pairs.values())
    logger.info("reranker flagged %d false negatives of %d mentions: %s", flagged, len(pairs), path)
    return path


def run_rerank_job(
    config: Config, denoise_negatives: bool = False
) -> tuple[list[RerankReport], TrainingSummary, Path]:
    """Train the joint reranker on the train split's candidates (the shared driver, under
    ``<run>/rerank``, resuming from its newest checkpoint), rerank every eval split, write
    ``<run>/rerank/reranker/`` (HF export), ``crossencoder_blink.bin`` (BLINK's cross-encoder
    layout) and ``rerank_report.json``; with ``denoise_negatives`` also the train candidates it
    flags as false negatives (:func:`write_false_negatives`). Returns the reports, the training
    summary and that directory."""
    check_rerank_inputs(config)
    settings = config.rerank
    retriever = None
    if settings.candidates == "retriever":
        step, export = resolve_checkpoint(config.run_dir, settings.retriever)
        retriever = IndexedModel.from_checkpoint(export.parent, step)
        init_ray(config.cluster, config.refresh.num_encoders * config.refresh.encoder_cpus)
    candidates = training_candidates_file(config, rerank_run_dir(config), retriever)
    task = TrainingTask.reranker(config, candidates)
    summary = run_task(config, task)
    reranker_step, export = resolve_checkpoint(task.run_dir, "newest")
    reranker = load_reranker(export, local_device(config.cluster.use_gpu))
    store = TokenStore.ensure(Path(config.data.root), reranker.tokenizer, reranker.entity_length)
    if denoise_negatives:
        write_false_negatives(config, reranker, store, candidates, reranker_step)
    reports = []
    for split in settings.eval_splits:
        candidates = _split_candidates(config, split, config.data.max_eval_mentions, retriever)
        reranked, _ = rerank(
            reranker,
            store,
            candidates,
            settings.num_candidates,
            scoring_batch_size(settings.training.batch_size),
        )
        reports.append(accuracy_report(split, candidates, reranked, settings.num_candidates))
    out = task.run_dir
    shutil.copytree(export, out / "reranker", dirs_exist_ok=True)
    export_blink_crossencoder(reranker, out / "crossencoder_blink.bin")
    write_reports(reports, summary, out / "rerank_report.json")
    return reports, summary, out
