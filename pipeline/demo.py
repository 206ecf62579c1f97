"""``hnce demo``: the main job end to end on real WordNet data (DESIGN.md §6, paper §6.5).

1. Convert Debian's WordNet to the Parquet contract (pipeline/data/wordnet.py; its split keeps
   lemmas apart, so test mentions have lemmas never seen in training).
2. Cut the demo subset (:func:`write_demo_subset`): sampled train and held-out test mentions, a
   catalogue of every synset sharing a lemma with their golds (the ambiguous senses) plus random
   synsets; entities and mentions get their part of speech as ``domain`` so the macro average
   is over nouns / verbs / adjectives / adverbs.
3. Evaluate the untrained encoder, train with random negatives, train with mixed-50 negatives
   on the asynchronous refresh, evaluate each; print recall@1/@64 and write JSON.
"""

from __future__ import annotations

import json
import shutil
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from cluster.checkpoints import EXPORT_DIR, newest_checkpoint
from cluster.index_build import IndexedModel
from cluster.tables import (
    SPLITS,
    Entity,
    EntityCatalogue,
    EntityCatalogueWriter,
    Mention,
    MentionSplit,
    MentionWriter,
    mention_split_path,
    write_summary,
)
from pipeline.config import Config
from pipeline.data.wordnet import convert_wordnet
from pipeline.evaluate import (
    RecallReport,
    evaluate_export,
    evaluate_model,
    format_table,
    untrained_export,
    write_reports,
)
from pipeline.train.trainer import TrainingSummary, run_training

PART_OF_SPEECH = {"n": "noun", "v": "verb", "a": "adjective", "r": "adverb"}


def _lemmas(text: str) -> list[str]:
    """The lemmas of a WordNet entity text ``"lemma, lemma: definition"`` (lower case)."""
    head = text.split(": ", 1)[0]
    return [lemma.strip().lower() for lemma in head.split(",") if lemma.strip()]


def _sample(mentions: list[Mention], count: int, rng: np.random.Generator) -> list[Mention]:
    if count <= 0 or count >= len(mentions):
        return mentions
    chosen = np.sort(rng.choice(len(mentions), size=count, replace=False))
    return [mentions[i] for i in chosen]


def write_demo_subset(
    source: Path,
    out: Path,
    catalogue_entities: int,
    train_mentions: int,
    eval_mentions: int,
    eval_split: str,
    seed: int = 0,
) -> dict[str, int]:
    """Write the demo dataset ``out`` from the converted WordNet ``source``; returns counts."""
    rng = np.random.default_rng(seed)
    catalogue = EntityCatalogue.open(source)
    keys = catalogue.keys().to_pylist()
    texts = catalogue.texts().to_pylist()
    titles = catalogue.titles().to_pylist()
    by_lemma: dict[str, list[int]] = defaultdict(list)
    for entity_id, text in enumerate(texts):
        for lemma in _lemmas(text):
            by_lemma[lemma].append(entity_id)

    train = _sample(
        MentionSplit.open(mention_split_path(source, "train")).read_all(), train_mentions, rng
    )
    held_out = _sample(
        MentionSplit.open(mention_split_path(source, eval_split)).read_all(), eval_mentions, rng
    )
    # Priority: every gold, then the other senses of the golds' lemmas (held-out mentions
    # first: they are the distractors the evaluation is about), then random synsets.
    ordered: list[int] = []
    for mention in [*held_out, *train]:
        ordered.extend(int(g) for g in (mention.golds or (mention.gold,)))
    for mention in [*held_out, *train]:
        for lemma in _lemmas(texts[mention.gold]):
            ordered.extend(by_lemma[lemma])
    ordered.extend(int(i) for i in rng.permutation(len(catalogue)))
    golds = {int(g) for m in [*held_out, *train] for g in (m.golds or (m.gold,))}
    limit = len(catalogue) if catalogue_entities <= 0 else max(catalogue_entities, len(golds))
    chosen: set[int] = set()
    for entity_id in ordered:
        if len(chosen) >= limit:
            break
        chosen.add(entity_id)
    old_ids = np.sort(np.fromiter(chosen, np.int64))
    new_id = {int(old): new for new, old in enumerate(old_ids)}

    if out.exists():
        shutil.rmtree(out)
    with EntityCatalogueWriter(out) as writer:
        for old in old_ids:
            writer.write(
                Entity(
                    entity_id=new_id[int(old)],
                    key=keys[old],
                    title=titles[old],
                    text=texts[old],
                    domain=PART_OF_SPEECH[keys[old][0]],
                )
            )
    splits = {"train": train, eval_split: held_out}
    for split in SPLITS:
        with MentionWriter(out, split) as writer:
            for mention in splits.get(split, []):
                golds = tuple(new_id[int(g)] for g in (mention.golds or (mention.gold,)))
                writer.write(
                    replace(
                        mention,
                        gold=new_id[int(mention.gold)],
                        golds=golds,
                        domain=PART_OF_SPEECH[keys[mention.gold][0]],
                    )
                )
    counts = {
        "entities": len(old_ids),
        "train_mentions": len(train),
        "eval_mentions": len(held_out),
    }
    write_summary(out, {"format": "wordnet-demo", "source": str(source), "seed": seed, **counts})
    return counts


@dataclass
class DemoResult:
    reports: list[RecallReport]
    trainings: dict[str, TrainingSummary]
    counts: dict[str, int]
    seconds: dict[str, float]


def run_demo(config: Config, announce: Callable[[str], None] = lambda _: None) -> DemoResult:
    """The whole demo under ``run.dir``; configs for the two trainings derive from ``config``.

    ``announce`` receives the table so far after each evaluation (the CLI prints it).
    """
    work_dir = config.run_dir
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    wordnet = work_dir / "wordnet"
    if not (wordnet / "summary.json").is_file():
        convert_wordnet(wordnet, Path(config.demo.wordnet_dir), seed=config.run.seed)
    data_root = work_dir / "wordnet-demo"
    counts = write_demo_subset(
        wordnet,
        data_root,
        config.demo.catalogue_entities,
        config.demo.train_mentions,
        config.demo.eval_mentions,
        config.data.eval_split,
        config.run.seed,
    )
    seconds["data"] = time.perf_counter() - started

    base = replace(config, data=replace(config.data, root=str(data_root)))
    reports: list[RecallReport] = []
    mark = time.perf_counter()
    untrained = IndexedModel.from_export(untrained_export(base))
    reports.append(evaluate_model(base, untrained, "untrained"))
    seconds["eval untrained"] = time.perf_counter() - mark
    announce(format_table(reports))

    variants = {
        "random": replace(
            base,
            negatives=replace(base.negatives, sampler="random", source="none"),
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
