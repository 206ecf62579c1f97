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
Zeshel sense: every mention counts), micro over mentions, Zeshel-style macro averages over
domains (the mean of per-domain figures), and apart for the mentions of entities some mention of
``data.train_split`` links to (*seen*) and of the others (*unseen*).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from hnce.cluster.compute.index_build import IndexedModel
from hnce.cluster.compute.recall import RecallReport, recall_report
from hnce.cluster.compute.refresh.heldout import eval_mentions, training_golds
from hnce.cluster.compute.retrieval import retrieve
from hnce.cluster.compute.session import init_ray
from hnce.cluster.stores.checkpoints import resolve_checkpoint
from hnce.pipeline.config import Config
from hnce.pipeline.data.kilt_predictions import SplitResult, link_files
from hnce.pipeline.preflight import check_eval_inputs
from hnce.pipeline.recipe_models import untrained_export
from hnce.pipeline.run import refresh_plan

logger = logging.getLogger(__name__)

PREDICTIONS_DIR = "predictions"


def evaluate_model(config: Config, model: IndexedModel, name: str) -> RecallReport:
    """Recall@``eval.ks`` of ``model`` on ``data.eval_split`` against every entity, through the
    encoder pool and an index version of the model held by the actors (``hnce.cluster.compute.retrieval``:
    the refresh's own version when it indexed this model, else one built for evaluation)."""
    check_eval_inputs(config)
    init_ray(config.cluster, config.refresh.num_encoders * config.refresh.encoder_cpus)
    mentions = eval_mentions(
        Path(config.data.root), config.data.eval_split, config.data.max_eval_mentions
    )
    retrieved = retrieve(
        refresh_plan(config),
        model,
        mentions,
        max(config.eval.ks),
        per_domain=config.eval.per_domain_catalogue,
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
    trained_on = training_golds(Path(config.data.root), config.data.train_split)
    report = recall_report(
        name, retrieved.cands, mentions, config.eval.ks, version.num_entities, trained_on
    )
    report.index = str(version.path)
    return report


def evaluate_export(config: Config, export_dir: Path, name: str | None = None) -> RecallReport:
    """Recall of the bi-encoder exported in ``export_dir`` (e.g. a checkpoint's ``export/``)."""
    model = IndexedModel.from_export(Path(export_dir))
    return evaluate_model(config, model, name or str(export_dir))


def resolve_model(config: Config, checkpoint: str) -> tuple[IndexedModel, str]:
    """(model, name) of a run's checkpoint: ``newest``, a ``step-<S>/`` or ``export/``
    directory, or ``untrained`` (``model.path`` itself with the recipe's scorer)."""
    if checkpoint == "untrained":
        model = IndexedModel.from_export(untrained_export(config))
        return model, f"untrained {config.model.path}"
    step, export = resolve_checkpoint(config.run_dir, checkpoint)
    return IndexedModel.from_checkpoint(export.parent, step), str(export.parent)


def evaluate_checkpoint(config: Config, checkpoint: str) -> RecallReport:
    """Recall of a run's checkpoint (:func:`resolve_model`) on ``data.eval_split``."""
    check_eval_inputs(config)
    model, name = resolve_model(config, checkpoint)
    return evaluate_model(config, model, name)


def predict_checkpoint(config: Config, checkpoint: str, aida: Sequence[Path]) -> list[SplitResult]:
    """KILT predictions of a run's checkpoint (:func:`resolve_model`) for every input line of the
    ``aida`` files, into ``<run>/predictions/<file name>``, through the cluster like
    :func:`evaluate_model` (accuracy for the files with a labelled split of ``data.root``)."""
    check_eval_inputs(config)
    model, _ = resolve_model(config, checkpoint)
    init_ray(config.cluster, config.refresh.num_encoders * config.refresh.encoder_cpus)
    k = max(config.eval.ks)
    predictions = config.run_dir / PREDICTIONS_DIR
    return link_files(refresh_plan(config), model, aida, k, predictions)
