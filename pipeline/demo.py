"""``hnce demo``: the main job end to end on real WordNet data (docs/input-formats.md, paper §6.5).

1. Convert Debian's WordNet to the Parquet contract (pipeline/data/wordnet.py; its split keeps
   lemmas apart, so test mentions have lemmas never seen in training).
2. Cut the demo subset (:func:`hnce.pipeline.data.demo_subset.write_demo_subset`): sampled train and
   held-out test mentions, a catalogue of every synset sharing a lemma with their golds (the
   ambiguous senses) plus random synsets.
3. Evaluate the untrained encoder, train with random negatives, train with mixed-50 negatives
   on the asynchronous refresh, evaluate each; print recall@1/@64 and write JSON.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from hnce.cluster.compute.index_build import IndexedModel
from hnce.cluster.compute.recall import RecallReport
from hnce.cluster.stores.checkpoints import EXPORT_DIR, newest_checkpoint
from hnce.cluster.stores.tables import MANIFEST_FILE
from hnce.pipeline.config import Config
from hnce.pipeline.data.conversion import DatasetOutput
from hnce.pipeline.data.demo_subset import write_demo_subset
from hnce.pipeline.data.wordnet import convert_wordnet
from hnce.pipeline.evaluate import evaluate_export, evaluate_model
from hnce.pipeline.metrics import format_table, write_reports
from hnce.pipeline.train.model import untrained_export
from hnce.pipeline.train.trainer import TrainingSummary, run_training


@dataclass
class DemoResult:
    reports: list[RecallReport]
    trainings: dict[str, TrainingSummary]
    counts: dict[str, int]
    seconds: dict[str, float]


def demo_dataset(config: Config) -> tuple[Config, dict[str, int]]:
    """Steps 1-2 under ``run.dir``: WordNet converted once, the demo subset cut; the config
    with ``data.root`` set to the subset, and the subset's counts."""
    wordnet = config.run_dir / "wordnet"
    if not (wordnet / MANIFEST_FILE).is_file():  # the manifest is written last: a conversion
        # without one crashed part way and is done again
        convert_wordnet(
            DatasetOutput(wordnet, overwrite=True), Path(config.demo.wordnet_dir), config.run.seed
        )
    data_root = config.run_dir / "wordnet-demo"
    counts = write_demo_subset(
        wordnet,
        data_root,
        config.demo.catalogue_entities,
        config.demo.train_mentions,
        config.demo.eval_mentions,
        config.data.eval_split,
        config.run.seed,
    )
    return replace(config, data=replace(config.data, root=str(data_root))), counts


def run_demo(config: Config, announce: Callable[[str], None] = lambda _: None) -> DemoResult:
    """The whole demo under ``run.dir``; configs for the two trainings derive from ``config``.

    ``announce`` receives the table so far after each evaluation (the CLI prints it).
    """
    work_dir = config.run_dir
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    base, counts = demo_dataset(config)
    seconds["data"] = time.perf_counter() - started

    reports: list[RecallReport] = []
    mark = time.perf_counter()
    untrained = IndexedModel.from_export(untrained_export(base))
    reports.append(evaluate_model(base, untrained, "untrained"))
    seconds["eval untrained"] = time.perf_counter() - mark
    announce(format_table(reports))

    variants = {
        "random": replace(
            base,
            negatives=replace(base.negatives, sampler="random", source="none", initial="random"),
            refresh=replace(base.refresh, enabled=False),
        ),
        f"mixed-{round(100 * base.negatives.mixed.hard_fraction)}": base,
    }
    trainings: dict[str, TrainingSummary] = {}
    for name, variant in variants.items():
        run_dir = work_dir / "runs" / name
        if run_dir.exists():
            shutil.rmtree(run_dir)
        variant = replace(variant, run=replace(variant.run, dir=str(run_dir)))
        mark = time.perf_counter()
        trainings[name] = run_training(variant)
        seconds[f"train {name}"] = time.perf_counter() - mark
        newest = newest_checkpoint(run_dir)
        if newest is None:
            raise RuntimeError(f"{run_dir}: training finished without a complete checkpoint")
        mark = time.perf_counter()
        reports.append(evaluate_export(base, newest[1] / EXPORT_DIR, f"trained, {name}"))
        seconds[f"eval {name}"] = time.perf_counter() - mark
        announce(f"{name}: {trainings[name].line()}\n{format_table(reports)}")
    seconds["total"] = time.perf_counter() - started
    result = DemoResult(reports, trainings, counts, seconds)
    write_reports(reports, work_dir / "demo_results.json")
    (work_dir / "demo_timings.json").write_text(json.dumps(seconds, indent=2) + "\n")
    return result


def demo_table(result: DemoResult) -> str:
    """recall@1 / @64 table of the demo (plus the other ks of the config)."""
    return format_table(result.reports)


def demo_summary(result: DemoResult, work_dir: Path) -> str:
    """What the CLI prints at the end: sizes, the recall table, each training, timings."""
    counts = result.counts
    lines = [
        f"WordNet demo: {counts['train_mentions']} training mentions, "
        f"{counts['eval_mentions']} held-out mentions (lemmas unseen in training), "
        f"{counts['entities']} synsets in the catalogue",
        demo_table(result),
        *(f"{name}: {training.line()}" for name, training in result.trainings.items()),
        "timings: " + ", ".join(f"{k} {v:.0f}s" for k, v in result.seconds.items()),
        f"results: {work_dir / 'demo_results.json'}",
    ]
    return "\n".join(lines)
