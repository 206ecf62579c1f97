"""``hnce demo``: the main job end to end on real WordNet data (docs/input-formats.md, paper §6.5).

1. Convert Debian's WordNet to the Parquet contract (pipeline/data/wordnet.py).
2. Cut the demo subset (:func:`hnce.pipeline.data.demo_subset.write_demo_subset`): sampled training
   mentions and, held out, mentions of synsets training links to (seen) and of synsets it never
   saw (unseen); a catalogue of every synset sharing a lemma with their golds (the ambiguous
   senses) plus random synsets. The data is the same whatever ``run.seed`` is.
3. Evaluate the untrained encoder, train with random + shared negatives, train with the recipe's
   own, evaluate each (its checkpoints at every ``demo.curve_every`` steps too); print recall@k
   on seen and unseen synsets and the recipe's difference from random with its paired 95%
   confidence interval, recall against each run's wall-clock, write JSON and plot the curves
   (``demo_recall.png``).

Before step 1 it prints what it is about to do and why (:func:`demo_recipe`, read from the config).
"""

from __future__ import annotations

import functools
import shutil
import textwrap
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from hnce.cluster.compute.index_build import IndexedModel
from hnce.cluster.compute.recall import RecallReport
from hnce.cluster.stores.checkpoints import EXPORT_DIR, checkpoint_dir, is_complete
from hnce.cluster.stores.files import AtomicPath
from hnce.cluster.stores.run_events import read_events
from hnce.cluster.stores.tables import MANIFEST_FILE
from hnce.events import RunEvent
from hnce.mining.losses import loss_options
from hnce.pipeline.comparison import paired_difference
from hnce.pipeline.config import Config
from hnce.pipeline.data.conversion import DatasetOutput
from hnce.pipeline.data.demo_subset import write_demo_subset
from hnce.pipeline.data.wordnet import convert_wordnet
from hnce.pipeline.evaluate import evaluate_export, evaluate_model
from hnce.pipeline.metrics import format_table, write_json_report, write_reports
from hnce.pipeline.recipe_models import untrained_export
from hnce.pipeline.train.trainer import TrainingSummary, run_training

CURVE_FILE = "demo_curves.json"
#: the data's seed: the subset is the same whatever ``run.seed`` is, so that two seeds of the demo
#: differ only in their order, draws and dropout and their runs can be paired
DATA_SEED = 0
PLOT_FILE = "demo_recall.png"


@dataclass
class CurvePoint:
    """A training run's recall at one checkpoint, with the wall seconds from the run's start to
    the checkpoint's publication (step 0, second 0: the untrained model)."""

    run: str
    step: int
    seconds: float
    recall: dict[int, float]
    #: "seen" / "unseen" -> recall@k on the mentions of seen and unseen entities (empty if none)
    exposure: dict[str, dict[int, float]] = field(default_factory=dict)

    @classmethod
    def of(cls, run: str, step: int, seconds: float, report: RecallReport) -> CurvePoint:
        """The point of ``report`` (its overall recall and, apart, its seen and unseen)."""
        exposure = {
            name: {k: figures[f"recall@{k}"] for k in report.recall}
            for name, figures in report.per_exposure.items()
        }
        return cls(run, step, seconds, report.recall, exposure)


@dataclass
class DemoResult:
    reports: list[RecallReport]
    trainings: dict[str, TrainingSummary]
    counts: dict[str, int]
    seconds: dict[str, float]
    curve: list[CurvePoint]


def demo_dataset(config: Config) -> tuple[Config, dict[str, int]]:
    """Steps 1-2 under ``run.dir``: WordNet converted once, the demo subset cut, both with
    :data:`DATA_SEED` whatever ``run.seed`` is; the config with ``data.root`` set to the subset,
    and the subset's counts."""
    wordnet = config.run_dir / "wordnet"
    if not (wordnet / MANIFEST_FILE).is_file():  # the manifest is written last: a conversion
        # without one crashed part way and is done again
        convert_wordnet(
            DatasetOutput(wordnet, overwrite=True), Path(config.demo.wordnet_dir), DATA_SEED
        )
    data_root = config.run_dir / "wordnet-demo"
    demo = config.demo
    counts = write_demo_subset(
        wordnet,
        data_root,
        demo.catalogue_entities,
        demo.train_mentions,
        demo.unseen_eval_mentions,
        config.data.eval_split,
        DATA_SEED,
        seen_mentions=demo.seen_eval_mentions,
    )
    return replace(config, data=replace(config.data, root=str(data_root))), counts


def run_demo(config: Config, announce: Callable[[str], None] = lambda _: None) -> DemoResult:
    """The whole demo under ``run.dir``; configs for the two trainings derive from ``config``.

    ``announce`` receives the table so far after each evaluation (the CLI prints it).
    """
    work_dir = config.run_dir
    steps = curve_steps(config)
    seconds: dict[str, float] = {}
    started_all = time.perf_counter()
    announce(demo_recipe(config))
    base, counts = demo_dataset(config)
    seconds["data"] = time.perf_counter() - started_all

    variants = {
        "random": replace(
            base,
            negatives=replace(
                base.negatives,
                sampler="random",
                source="none",
                initial="random",
                cache=replace(base.negatives.cache, enabled=False),
            ),
            refresh=replace(base.refresh, enabled=False),
        ),
        hard_run_name(base): base,
    }
    runs = work_dir / "runs"
    if runs.exists():
        shutil.rmtree(runs)
    variants = {
        name: replace(variant, run=replace(variant.run, dir=str(runs / name)))
        for name, variant in variants.items()
    }
    # the untrained model is evaluated in the run that starts from it (the initial negatives
    # from the model), whose initial negatives then take that index over instead of encoding it again
    starting = next((v for v in variants.values() if v.negatives.initial == "model"), base)
    reports: list[RecallReport] = []
    mark = time.perf_counter()
    untrained = IndexedModel.from_export(untrained_export(starting))
    reports.append(evaluate_model(starting, untrained, "untrained"))
    seconds["eval untrained"] = time.perf_counter() - mark
    announce(format_table(reports))

    trainings: dict[str, TrainingSummary] = {}
    curve: list[CurvePoint] = []
    for name, variant in variants.items():
        mark, started = time.perf_counter(), time.time()
        trainings[name] = run_training(variant)
        seconds[f"train {name}"] = time.perf_counter() - mark
        mark = time.perf_counter()
        points = training_curve(
            name,
            variant.run_dir,
            started,
            steps,
            functools.partial(evaluate_export, variant),
        )
        reports.append(points[-1][1])
        curve += [CurvePoint.of(name, 0, 0.0, reports[0])] + [p for p, _ in points]
        seconds[f"eval {name}"] = time.perf_counter() - mark
        announce(f"{name}: {trainings[name].line()}\n{format_table(reports)}")
    seconds["total"] = time.perf_counter() - started_all
    result = DemoResult(reports, trainings, counts, seconds, curve)
    write_reports(reports, work_dir / "demo_results.json")
    write_json_report(work_dir / "demo_timings.json", seconds)
    write_json_report(work_dir / CURVE_FILE, [asdict(p) for p in curve])
    plot_curve(curve, work_dir / PLOT_FILE)
    return result


def hard_run_name(config: Config) -> str:
    """The name of the demo's run on the recipe's own negatives: ``mixed-50`` for mixed-50,
    ``recipe: <sampler>`` for another sampler (never ``random``, the baseline run's name)."""
    negatives = config.negatives
    if negatives.sampler == "mixed":
        return f"mixed-{round(100 * negatives.mixed.hard_fraction)}"
    return f"recipe: {negatives.sampler}"


def demo_recipe(config: Config) -> str:
    """What the demo is about to do and why, read from ``config``: printed before it starts."""
    training, negatives, refresh = config.training, config.negatives, config.refresh
    hard = hard_run_name(config)
    if negatives.sampler == "mixed":
        share = round(100 * negatives.mixed.hard_fraction)
        searched = (
            "the negative cache, entity vectors every step rewrites (Lindgren et al. 2021)"
            if negatives.cache.enabled
            else "the newest index"
        )
        drawn = (
            f"{share}% of each mention's negatives from the top {refresh.top_n} of {searched} "
            "(hard: the other senses of its lemma rank there), the rest uniform "
            "(Zhang & Stratos 2021, §6.3; §6.4: a gradient bias nearly as small as hard ones')"
        )
    else:
        drawn = f"negatives.sampler: {negatives.sampler}"
    start = {
        "model": "the initial negatives mined with the starting model: hard negatives from step 1",
        "lexical": "the initial negatives from BM25 candidates until the first refresh lands",
        "random": (
            "no initial negatives: the cache holds the vectors the steps compute, so the first step's "
            "negatives are random and each later one draws among the entities trained on so far"
            if negatives.cache.enabled
            else "random negatives until the first refresh lands"
        ),
    }[negatives.initial]
    if not refresh.enabled:
        refreshed = "mined once, never refreshed"
    elif refresh.mode == "sync":
        refreshed = (
            f"training waits for a refresh at every checkpoint (every "
            f"{training.checkpoint_every} steps)"
        )
    elif refresh.trigger == "stale":
        refreshed = "the index re-encoded beside training when the negatives go stale"
    elif refresh.trigger == "payoff":
        refreshed = (
            "the index re-encoded beside training only when it pays: the hard negatives drawn "
            f"are {refresh.payoff.max_negative_age}+ steps old on average and a refresh would land "
            "with time left to train on it"
        )
    else:
        refreshed = (
            f"the index re-encoded from the checkpoint of every {training.checkpoint_every} "
            "steps beside training (ANCE's asynchronous refresh)"
        )
    cosine = config.model.normalize is not False  # unset: a fresh model is normalised
    scores = "cosine scores" if cosine else "dot-product scores"
    temperature = loss_options(config.loss.name, config.loss.temperature, cosine).get("temperature")
    scaled = f" / temperature {temperature}" if temperature not in (None, 1.0) else ""
    sharing = {
        "none": "each mention scored against its own candidates",
        "batch": "every mention scored against every candidate of its step",
        "global": "every mention scored against every candidate of every worker's step",
    }[negatives.share]
    catalogue = config.demo.catalogue_entities or "all the"
    paragraphs = [
        f"hnce demo: {config.model.path} trained twice, {training.steps} steps of "
        f"{training.batch_size} mentions with {negatives.num_negatives} negatives each, "
        f"learning rate {training.learning_rate:g}",
        "- random: negatives drawn uniformly from the catalogue (the baseline)",
        f"- {hard}: {drawn}; {start}; {refreshed}",
        f"- both: {scores}{scaled}; {sharing}; training.cores: {training.cores}",
        f"evaluated apart on {config.demo.seen_eval_mentions} held-out mentions of synsets a "
        f"training mention links to (seen) and {config.demo.unseen_eval_mentions} of synsets "
        f"none does (unseen), over {catalogue} synsets: every gold, the other senses of their "
        "lemmas, then random synsets",
    ]
    return "\n".join(
        textwrap.fill(text, 100, subsequent_indent="  ", break_on_hyphens=False)
        for text in paragraphs
    )


def curve_steps(config: Config) -> list[int]:
    """The checkpoints of each run evaluated besides the final one: every ``demo.curve_every``
    steps. ConfigError when a run does not write them or does not keep them to its end."""
    every, training = config.demo.curve_every, config.training
    if every == 0:
        return []
    if every % training.checkpoint_every:
        raise config.error(
            "demo.curve_every",
            f"({every}) must be a multiple of 'training.checkpoint_every' "
            f"({training.checkpoint_every}): the curve evaluates checkpoints",
        )
    oldest_kept = training.steps - (training.keep_checkpoints - 1) * training.checkpoint_every
    if every < oldest_kept:
        raise config.error(
            "demo.curve_every",
            f"({every}) asks for the checkpoint of step {every}, but a run of "
            f"{training.steps} steps keeps only its newest {training.keep_checkpoints} "
            f"('training.keep_checkpoints'), from step {oldest_kept} on: raise "
            f"'training.keep_checkpoints' or 'demo.curve_every'",
        )
    return list(range(every, training.steps, every))


def training_curve(
    name: str,
    run_dir: Path,
    started: float,
    steps: list[int],
    evaluate: Callable[[Path, str], RecallReport],
) -> list[tuple[CurvePoint, RecallReport]]:
    """Run ``name``'s checkpoints at ``steps`` and its final one, each evaluated by
    ``evaluate(export directory, report name)``, with the wall seconds from ``started`` (the
    run's start, epoch seconds) to its publication in the run's event log; RuntimeError naming
    the checkpoint when one is missing."""
    published = {
        int(e["step"]): float(e["time"]) - started
        for e in read_events(run_dir, RunEvent.CHECKPOINT)
    }
    if not published:
        raise RuntimeError(f"{run_dir}: training finished without a complete checkpoint")
    points = []
    final = max(published)
    for step in [*steps, final]:
        directory = checkpoint_dir(run_dir, step)
        if step not in published or not is_complete(directory):
            raise RuntimeError(f"{directory}: no complete checkpoint to evaluate for the curve")
        label = f"trained, {name}" if step == final else f"{name}, step {step}"
        report = evaluate(directory / EXPORT_DIR, label)
        points.append((CurvePoint.of(name, step, published[step], report), report))
    return points


def plot_curve(curve: list[CurvePoint], out: Path) -> Path:
    """Held-out R@1 against wall seconds, one line per run: one panel each for the mentions of
    seen and of unseen entities where the points tell them apart, else one per k (the first and
    the last of ``eval.ks``); into the PNG ``out``, published atomically."""
    from matplotlib.figure import Figure  # no pyplot: no display, no global state

    ks = sorted(curve[0].recall)
    exposures = sorted(curve[0].exposure)
    panels: list[tuple[str, int]] = (
        [(exposure, ks[0]) for exposure in exposures]
        if exposures
        else [("", k) for k in sorted({ks[0], ks[-1]})]
    )
    runs = list(dict.fromkeys(p.run for p in curve))
    figure = Figure(figsize=(5 * len(panels), 3.6), layout="constrained")
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    for axis, (exposure, k) in zip(axes, panels, strict=True):
        for run in runs:
            points = [p for p in curve if p.run == run]
            recall = [p.exposure[exposure][k] if exposure else p.recall[k] for p in points]
            axis.plot([p.seconds for p in points], recall, marker="o", label=run)
        axis.set_xlabel("seconds from the training run's start")
        axis.set_ylabel(f"held-out R@{k}" + (f", {exposure} entities" if exposure else ""))
        axis.legend()
    figure.suptitle("hnce demo: recall against wall-clock")
    with AtomicPath(out) as temporary:
        figure.savefig(temporary, format="png", dpi=100)
    return out


def curve_table(curve: list[CurvePoint]) -> str:
    """Recall against wall-clock, one line per run and checkpoint; then R@1 on the mentions of
    seen and unseen entities where the points tell them apart."""
    ks = sorted(curve[0].recall)
    exposures = sorted(curve[0].exposure)
    header = (
        f"{'run':<12}{'step':>6}{'seconds':>9}"
        + "".join(f"{'R@' + str(k):>8}" for k in ks)
        + "".join(f"{f'R@{ks[0]} ' + exposure:>15}" for exposure in exposures)
    )
    rows = [
        f"{p.run:<12}{p.step:>6}{p.seconds:>9.0f}"
        + "".join(f"{p.recall[k]:>8.3f}" for k in ks)
        + "".join(f"{p.exposure[exposure][ks[0]]:>15.3f}" for exposure in exposures)
        for p in curve
    ]
    return "\n".join([header, *rows])


def demo_table(result: DemoResult) -> str:
    """recall@1 / @64 table of the demo (plus the other ks of the config)."""
    return format_table(result.reports)


def demo_verdict(result: DemoResult) -> list[str]:
    """Which run won at each cutoff, on the mentions of seen and of unseen entities apart: the
    recipe's run (the last report) against random (the one before), the difference with its
    paired 95% confidence interval over the held-out mentions (:mod:`hnce.pipeline.comparison`;
    one seed: it says what these mentions can tell apart, not how another seed would fall)."""
    baseline, recipe = result.reports[-2], result.reports[-1]
    names = [report.name.removeprefix("trained, ") for report in (baseline, recipe)]
    if baseline.hits is None or recipe.hits is None:
        return []
    seen = recipe.seen if recipe.seen is not None else np.zeros(len(recipe.hits), bool)
    lines = []
    for exposure, rows in (("seen", np.flatnonzero(seen)), ("unseen", np.flatnonzero(~seen))):
        if not len(rows):
            continue
        for column, k in enumerate(sorted(recipe.recall)):
            paired = paired_difference(recipe.hits[rows, column], baseline.hits[rows, column])
            ahead = names[1] if paired.mean > 0 else names[0] if paired.mean < 0 else "neither"
            lines.append(
                f"{exposure} entities, R@{k}: {names[1]} - {names[0]} = {paired.cell()} "
                f"(95% CI over {len(rows)} mentions): {ahead} ahead, the interval "
                f"{paired.verdict}"
            )
    return lines


def demo_summary(result: DemoResult, work_dir: Path) -> str:
    """What the CLI prints at the end: sizes, the recall table, each training, timings."""
    counts = result.counts
    lines = [
        f"WordNet demo: {counts['train_mentions']} training mentions; held out, "
        f"{counts['seen_eval_mentions']} mentions of seen and "
        f"{counts['unseen_eval_mentions']} of unseen synsets; {counts['entities']} synsets in "
        "the catalogue",
        demo_table(result),
        *demo_verdict(result),
        *(f"{name}: {training.line()}" for name, training in result.trainings.items()),
        "recall against wall-clock (seconds from each training run's start to the checkpoint):",
        curve_table(result.curve),
        f"plot: {work_dir / PLOT_FILE}",
        "timings: " + ", ".join(f"{k} {v:.0f}s" for k, v in result.seconds.items()),
        f"results: {work_dir / 'demo_results.json'}",
    ]
    return "\n".join(lines)
