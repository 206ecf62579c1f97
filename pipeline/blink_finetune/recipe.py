"""``hnce finetune-blink`` end to end (paper §6.8): BLINK's bi-encoder fine-tuned on KILT AIDA.

1. Convert: the catalogue (BLINK's ``entity.jsonl``, entity_id = BLINK row, or the KILT knowledge
   source) and the AIDA files to Parquet (DESIGN.md §2). Train mentions whose gold is not in the
   catalogue cannot be trained on: they are skipped, counted and written to a rejects file.
   Labelled dev/test mentions keep them (``gold = MISSING_GOLD``) so accuracy counts them as
   errors. Unlabelled files (``test_without_answers``) only get predictions.
2. Import the BLINK checkpoint (``encoders.blink``) with the configured scorer (dual, or multi-m
   over the same towers) and export it as the run's starting model.
3. Index version 0: BLINK's precomputed encodings (``.t7``, memory-mapped) when given, else
   encoded from the checkpoint; train negatives version 0 mined from it, so mixed-50 training
   has hard negatives from step 0.
4. Train through ``pipeline.train`` (DeepSpeed workers under Ray Train, asynchronous refresh)
   over the whole catalogue.
5. Evaluate against every entity, before (index v0) and after fine-tuning (an index version of
   the final checkpoint, built by the refresh); write KILT predictions for every input id.
6. Export the fine-tuned model in Hugging Face format and in BLINK's checkpoint layout.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster.checkpoints import EXPORT_DIR, newest_checkpoint
from cluster.index_store import IndexStore, IndexVersion
from cluster.negatives_store import NegativesStore
from cluster.refresh import run_refresh
from cluster.session import init_ray
from cluster.tables import (
    EntityCatalogue,
    MentionSplit,
    mention_split_path,
    read_summary,
    write_summary,
)
from encoders.biencoder import BiEncoder, export_biencoder, load_biencoder
from encoders.blink import export_blink_biencoder, import_blink_biencoder
from pipeline.blink_finetune.index_v0 import (
    INITIAL_VERSION,
    index_from_encodings,
    index_from_model,
    mine_initial_negatives,
)
from pipeline.blink_finetune.kilt_output import (
    LinkingAccuracy,
    as_mentions,
    linking_accuracy,
    read_kilt_inputs,
    write_kilt_predictions,
)
from pipeline.config import BlinkSettings, Config, config_from_dict
from pipeline.data.bad_rows import BadRowPolicy
from pipeline.data.blink import convert_blink_entities
from pipeline.data.kilt import aida_split_name, convert_aida_split, convert_knowledge_source
from pipeline.preflight import check_blink_inputs
from pipeline.rerank import retrieve_candidates
from pipeline.train.refresh_supervisor import refresh_plan
from pipeline.train.trainer import run_training

DATASET_FORMAT = "blink-finetune"
INITIAL_EXPORT = Path("initial") / "export"
BLINK_EXPORT = Path("export") / "biencoder_blink.bin"
HF_EXPORT = Path("export") / "hf"
REPORT_FILE = "finetune_report.json"
TRAIN_REJECTS = "rejects-train.jsonl"


@dataclass
class SplitResult:
    """Predictions of one input file and, when it is labelled, accuracy before and after."""

    file: str
    split: str
    inputs: int
    predictions: str
    before: LinkingAccuracy | None = None
    after: LinkingAccuracy | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "split": self.split,
            "inputs": self.inputs,
            "predictions": self.predictions,
            "before": None if self.before is None else self.before.to_json(),
            "after": None if self.after is None else self.after.to_json(),
        }


@dataclass
class FinetuneReport:
    """What the recipe did and measured."""

    run_dir: Path
    data: dict[str, Any]
    training: str
    final_step: int
    splits: list[SplitResult] = field(default_factory=list)
    exports: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": str(self.run_dir),
            "data": self.data,
            "training": self.training,
            "final_step": self.final_step,
            "splits": [s.to_json() for s in self.splits],
            "exports": self.exports,
        }

    def lines(self) -> list[str]:
        """Human-readable summary (Table 4 style: accuracy without and with fine-tuning)."""
        out = [self.training]
        rejected = self.data.get("train_rejected", 0)
        if rejected:
            out.append(f"train mentions skipped (gold not in the catalogue etc.): {rejected}")
        for result in self.splits:
            if result.after is None:
                out.append(f"{result.file}: {result.inputs} predictions (unlabelled)")
                continue
            before = result.before.accuracy if result.before is not None else float("nan")
            after = result.after
            out.append(
                f"{result.split}: accuracy {before:.4f} → {after.accuracy:.4f} over "
                f"{after.mentions} mentions ({after.missing_gold} with the gold missing from "
                f"the catalogue, counted as errors; {after.accuracy_in_catalogue:.4f} without "
                f"them), recall@{after.k} {after.recall_at_k:.4f}"
            )
        out.append(f"predictions: {', '.join(s.predictions for s in self.splits)}")
        out.append(f"exports: {json.dumps(self.exports)}")
        return out


def convert_inputs(root: Path, inputs: BlinkSettings) -> dict[str, Any]:
    """Catalogue + AIDA splits under ``root`` (skipped when a previous run finished it)."""
    root = Path(root)
    if (root / "summary.json").is_file():
        summary = read_summary(root)
        if summary.get("format") == DATASET_FORMAT:
            return summary
    policy = BadRowPolicy("strict")
    if inputs.entities is not None:
        catalogue_summary = convert_blink_entities(
            Path(inputs.entities), root, policy, inputs.max_text_chars
        )
    else:
        assert inputs.knowledge_source is not None
        catalogue_summary = convert_knowledge_source(
            Path(inputs.knowledge_source), root, policy, inputs.max_text_chars
        )
    catalogue = EntityCatalogue.open(root)
    mentions: dict[str, int] = {}
    missing_kept = train_rejected = 0
    unlabelled: list[str] = []
    for path in map(Path, inputs.aida):
        split = aida_split_name(path)
        if split == "train":
            with BadRowPolicy("skip", root / TRAIN_REJECTS) as train_policy:
                counts = convert_aida_split(path, root, catalogue, train_policy, False, split)
                train_rejected = train_policy.total
        elif any(item.labelled for item in read_kilt_inputs(path)):
            counts = convert_aida_split(path, root, catalogue, policy, True, split)
            missing_kept += counts["missing_gold_kept"]
        else:
            unlabelled.append(str(path))
            continue
        mentions[split] = counts["mentions"]
    summary = {
        "format": DATASET_FORMAT,
        "catalogue": catalogue_summary,
        "entities": len(catalogue),
        "mentions": mentions,
        "missing_gold_kept": missing_kept,
        "train_rejected": train_rejected,
        "unlabelled_files": unlabelled,
        "bad_rows": policy.summary(),
    }
    write_summary(root, summary)
    return summary


def initial_model(config: Config, export_dir: Path) -> BiEncoder:
    """BLINK's bi-encoder with the configured scorer, exported once as the run's starting model."""
    if (export_dir / "scorer.json").is_file():
        return load_biencoder(export_dir)
    model = import_blink_biencoder(
        Path(config.blink.checkpoint),
        Path(config.blink.base_model),
        scorer=config.model.scorer,
        mention_length=config.model.mention_length,
        entity_length=config.model.entity_length,
    )
    export_biencoder(model, export_dir)
    return model


def with_model_path(config: Config, export_dir: Path) -> Config:
    """The config with ``model.path`` set to the imported model's export directory."""
    tree = config.to_dict()
    tree["model"]["path"] = str(export_dir.resolve())
    return config_from_dict(tree)


def prepare_version_zero(config: Config, model: BiEncoder, export_dir: Path) -> IndexVersion | None:
    """Index and train negatives version 0 (kept when the run already has them); None when a
    resumed run's retention has already removed version 0."""
    run_dir = config.run_dir
    store = IndexStore(run_dir / "index", keep=config.index.keep_versions)
    versions = store.versions()
    version = store.open(INITIAL_VERSION) if INITIAL_VERSION in versions else None
    if not versions:
        catalogue = EntityCatalogue.open(Path(config.data.root))
        if config.blink.encodings is not None:
            version = index_from_encodings(
                store,
                Path(config.blink.encodings),
                model,
                export_dir,
                len(catalogue),
                config.index,
                config.blink.index_shard_size,
            )
        else:
            version = index_from_model(
                store,
                model,
                export_dir,
                catalogue,
                config.index,
                batch_size=config.refresh.batch_size,
            )
    negatives = NegativesStore(run_dir / "negatives", keep=config.index.keep_versions)
    if version is not None and negatives.current_version() is None:
        split = config.data.train_split
        mentions = MentionSplit.open(mention_split_path(Path(config.data.root), split)).read_all()
        mine_initial_negatives(negatives, version, model, split, mentions, config.refresh.top_n)
    return version


def link_files(
    model: BiEncoder,
    index_version: IndexVersion,
    catalogue: EntityCatalogue,
    data_root: Path,
    aida: Sequence[Path],
    k: int,
    predictions_dir: Path | None,
) -> list[SplitResult]:
    """Top-``k`` entities of every input of every file; predictions (top 1) written to
    ``predictions_dir/<file name>``; accuracy for the files with a labelled Parquet split."""
    results = []
    for path in aida:
        inputs = read_kilt_inputs(path)
        found = retrieve_candidates(
            model, as_mentions(inputs), k, index_version=index_version, progress=False
        ).cands
        written = ""
        if predictions_dir is not None:
            target = predictions_dir / Path(path).name
            write_kilt_predictions(target, inputs, found[:, 0], catalogue)
            written = str(target)
        split = aida_split_name(path)
        accuracy = None
        split_path = mention_split_path(data_root, split)
        if split != "train" and split_path.is_file():
            labelled = MentionSplit.open(split_path).read_all()
            by_id = {item.id: row for item, row in zip(inputs, found, strict=True)}
            accuracy = linking_accuracy(split, labelled, by_id)
        results.append(SplitResult(Path(path).name, split, len(inputs), written, after=accuracy))
    return results


def final_index(config: Config, step: int) -> IndexVersion:
    """An index version built from checkpoint ``step``: the refresh's own when it caught up,
    else one refresh now through the encoder pool (which also resumes an abandoned one)."""
    store = IndexStore(config.run_dir / "index", keep=config.index.keep_versions)
    current = store.current()
    if current is not None and current.checkpoint == step:
        return current
    init_ray(config.cluster, config.refresh.encoder_cpus)
    run_refresh(refresh_plan(config), step)
    version = store.current()
    assert version is not None and version.checkpoint == step
    return version


def finetune_blink(config: Config, progress: bool = True) -> FinetuneReport:
    """The whole recipe; every stage is skipped when a previous run of ``run.dir`` finished it,
    and training resumes from the newest checkpoint."""
    check_blink_inputs(config)
    inputs = config.blink
    run_dir = config.run_dir.resolve()
    data_root = Path(config.data.root)
    data_summary = convert_inputs(data_root, inputs)
    catalogue = EntityCatalogue.open(data_root)
    export_dir = run_dir / INITIAL_EXPORT
    model = initial_model(config, export_dir)
    config = with_model_path(config, export_dir)
    version_zero = prepare_version_zero(config, model, export_dir)
    k = max(config.eval.ks)
    before = (
        link_files(model, version_zero, catalogue, data_root, list(map(Path, inputs.aida)), k, None)
        if version_zero is not None
        else None
    )

    summary = run_training(config, progress=progress)
    newest = newest_checkpoint(run_dir)
    if newest is None:
        raise RuntimeError(f"{run_dir}: training published no checkpoint")
    step, checkpoint = newest
    final_export = checkpoint / EXPORT_DIR
    final_model = load_biencoder(final_export)
    after = link_files(
        final_model,
        final_index(config, step),
        catalogue,
        data_root,
        list(map(Path, inputs.aida)),
        k,
        run_dir / "predictions",
    )
    for result, initial in zip(after, before or [], strict=False):
        result.before = initial.after
    hf_export = run_dir / HF_EXPORT
    shutil.copytree(final_export, hf_export, dirs_exist_ok=True)
    export_blink_biencoder(final_model, run_dir / BLINK_EXPORT)
    report = FinetuneReport(
        run_dir=run_dir,
        data=data_summary,
        training=summary.line(),
        final_step=step,
        splits=after,
        exports={"hf": str(hf_export), "blink": str(run_dir / BLINK_EXPORT)},
    )
    (run_dir / REPORT_FILE).write_text(json.dumps(report.to_json(), indent=2) + "\n")
    return report
