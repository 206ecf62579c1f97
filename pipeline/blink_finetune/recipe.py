"""``hnce finetune-blink`` end to end (paper §6.8): BLINK's bi-encoder fine-tuned on KILT AIDA.

1. Convert: the catalogue (BLINK's ``entity.jsonl``, entity_id = BLINK row, or the KILT knowledge
   source) and the AIDA files to Parquet (docs/stores.md). Train mentions whose gold is not in the
   catalogue cannot be trained on: they are skipped, counted and written to the dataset's
   rejects file.
   Labelled dev/test mentions keep them (``gold = MISSING_GOLD``) so accuracy counts them as
   errors. Unlabelled files (``test_without_answers``) only get predictions.
2. Import the BLINK checkpoint (``hnce.encoders.blink_checkpoint``) with the configured scorer
   (dual, or multi-m over the same towers) and export it as the run's starting model.
3. The initial negatives, index version 0, by the encoder actors (``hnce.cluster.compute.refresh.initial``): BLINK's precomputed encodings
   (``.t7``, memory-mapped) when given, else encoded from the checkpoint; train negatives
   mined from it, so mixed-50 training has hard negatives from step 0.
4. Train through ``hnce.pipeline.train`` (DeepSpeed workers under Ray Train, asynchronous refresh)
   over the whole catalogue.
5. Link every input of every AIDA file against every entity through the cluster
   (``hnce.cluster.compute.retrieval``), before (with index v0) and after fine-tuning (with the refresh's
   version of the final checkpoint when it caught up, else one built for it in
   ``<run>/eval-index/``); accuracy on the labelled files, KILT predictions for every input id.
   The driver never holds the catalogue's vectors.
6. Export the fine-tuned model in Hugging Face format and in BLINK's checkpoint layout.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hnce.cluster.compute.index_build import IndexedModel
from hnce.cluster.compute.refresh.initial import initial_from_model
from hnce.cluster.compute.session import init_ray
from hnce.cluster.stores.checkpoints import EXPORT_DIR, newest_checkpoint
from hnce.cluster.stores.tables import MANIFEST_FILE
from hnce.cluster.stores.tables_read import read_summary
from hnce.encoders.biencoder import SCORER_FILE, export_biencoder, load_biencoder
from hnce.encoders.blink_checkpoint import export_blink_biencoder, import_blink_biencoder
from hnce.pipeline.config import BlinkSettings, Config, config_from_dict
from hnce.pipeline.data.bad_rows import BadRowKind
from hnce.pipeline.data.conversion import CONVERSION_SUMMARY, DatasetOutput
from hnce.pipeline.data.kilt import convert_kilt
from hnce.pipeline.data.kilt_predictions import SplitResult, link_files, read_kilt_inputs
from hnce.pipeline.preflight import check_blink_inputs
from hnce.pipeline.run import refresh_plan
from hnce.pipeline.train.trainer import run_training

DATASET_FORMAT = "blink-finetune"
INITIAL_EXPORT = Path("initial") / "export"
BLINK_EXPORT = Path("export") / "biencoder_blink.bin"
HF_EXPORT = Path("export") / "hf"
REPORT_FILE = "finetune_report.json"


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
    """Catalogue + labelled AIDA splits published as the dataset ``root`` (kept when a previous
    run published it). Train mentions whose gold is not in the catalogue are skipped, counted and
    written to the dataset's rejects file; dev/test mentions keep them (``MISSING_GOLD``);
    unlabelled files only get predictions."""
    root = Path(root)
    aida = [Path(path) for path in inputs.aida]
    unlabelled = [path for path in aida if not any(i.labelled for i in read_kilt_inputs(path))]
    if (root / MANIFEST_FILE).is_file() and read_summary(root).get("format") == DATASET_FORMAT:
        summary = read_summary(root, CONVERSION_SUMMARY)
    else:
        if inputs.entities is not None:
            source = {"blink_entities": Path(inputs.entities)}
        else:
            assert inputs.knowledge_source is not None
            source = {"knowledge_source": Path(inputs.knowledge_source)}
        summary = convert_kilt(
            DatasetOutput(root, skip_kinds=(BadRowKind.GOLD_NOT_IN_CATALOGUE,)),
            [path for path in aida if path not in unlabelled],
            keep_missing_gold=("dev", "test"),
            converter=DATASET_FORMAT,
            **source,
        )
    return {
        **summary,
        "train_rejected": summary["bad_rows"]["rejected"][BadRowKind.GOLD_NOT_IN_CATALOGUE],
        "unlabelled_files": [str(path) for path in unlabelled],
    }


def initial_export(config: Config, export_dir: Path) -> Path:
    """BLINK's bi-encoder with the configured scorer, exported once as the run's starting model."""
    if (export_dir / SCORER_FILE).is_file():
        return export_dir
    model = import_blink_biencoder(
        Path(config.blink.checkpoint),
        Path(config.blink.base_model),
        scorer=config.model.scorer,
        mention_length=config.model.mention_length,
        entity_length=config.model.entity_length,
    )
    export_biencoder(model, export_dir)
    return export_dir


def with_model_path(config: Config, export_dir: Path) -> Config:
    """The config with ``model.path`` set to the imported model's export directory."""
    tree = config.to_dict()
    tree["model"]["path"] = str(export_dir.resolve())
    return config_from_dict(tree)


def finetune_blink(config: Config) -> FinetuneReport:
    """The whole recipe; every stage is skipped when a previous run of ``run.dir`` finished it,
    and training resumes from the newest checkpoint."""
    check_blink_inputs(config)
    inputs = config.blink
    run_dir = config.run_dir.resolve()
    data_summary = convert_inputs(Path(config.data.root), inputs)
    config = with_model_path(config, initial_export(config, run_dir / INITIAL_EXPORT))
    # One Ray instance for the whole recipe, sized for training (which reuses it).
    training, refresh = config.training, config.refresh
    init_ray(
        config.cluster,
        training.num_workers * training.cpus_per_worker
        + refresh.num_encoders * refresh.encoder_cpus,
    )
    plan = refresh_plan(config)
    initial = IndexedModel.from_export(run_dir / INITIAL_EXPORT)
    encodings = None if inputs.encodings is None else Path(inputs.encodings)
    initial_from_model(plan, initial, config.data.train_split, encodings)
    aida, k = list(map(Path, inputs.aida)), max(config.eval.ks)
    before = link_files(plan, initial, aida, k, None)

    summary = run_training(config)
    newest = newest_checkpoint(run_dir)
    if newest is None:
        raise RuntimeError(f"{run_dir}: training published no checkpoint")
    step, checkpoint = newest
    final = IndexedModel.from_checkpoint(checkpoint, step)
    after = link_files(plan, final, aida, k, run_dir / "predictions")
    for result, initial_result in zip(after, before, strict=True):
        result.before = initial_result.after
    hf_export = run_dir / HF_EXPORT
    shutil.copytree(checkpoint / EXPORT_DIR, hf_export, dirs_exist_ok=True)
    export_blink_biencoder(load_biencoder(checkpoint / EXPORT_DIR), run_dir / BLINK_EXPORT)
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
