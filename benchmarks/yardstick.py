"""The yardstick: negatives recipes against random + shared on seen and unseen entities, with
paired 95% confidence intervals, on two real-text domains.

Every arm is the product's training step (:class:`~hnce.pipeline.train.worker.WorkerRun`, its
DeepSpeed engine and :func:`~hnce.pipeline.train.step.train_step` over the worker's own
micro-batches) on configs/demo.yaml's model and budget, in one process on every core, no refresh.
What the comparison holds fixed and what it pairs:

- **The data is fixed across seeds**: one subset per domain
  (:func:`~hnce.pipeline.data.demo_subset.write_demo_subset`, seed 0), whose evaluation split
  holds *seen* mentions (another context of an entity a training mention links to) and *unseen*
  ones (an entity no training mention of the whole source links to). A seed changes the order, the
  draws and dropout only, and the arms of a seed share it.
- **What every arm shares is computed once**: the starting model's index and negatives version 0
  (the product's :func:`~hnce.cluster.compute.refresh.initial.prepare_initial_negatives`, one encoder
  actor a core), copied into every arm that starts from it; its seconds count in each such arm's
  wall-clock.
- **The difference** at R@1, R@8 and R@64 of each arm against random + shared is the mean over
  seeds and mentions of the paired hit difference, with its 95% interval from a two-level
  bootstrap over seeds and mentions and the minimum detectable difference it reaches
  (:mod:`hnce.pipeline.comparison`).

Arms (:data:`ARMS`), every one against *random + shared* (uniform negatives, every candidate of a
step shared, no cache): *mixed-50, cache* (half of the negatives from the top of the negative
cache, filled from the starting model's version 0 and written by every step); *no version 0*
(the cache filled by the steps alone: the first step draws random, each later one among the
entities trained on so far; no pass over the catalogue at all); *refresh rows* (64 of the oldest
rows re-encoded a step); *whole catalogue* (every cached row also in each mention's softmax,
docs/math.md eq. (61)), with mixed-50 or with random draws; *easy first* (no hard negatives for
30 steps, then a ramp to half by step 90, eq. (59)); *positive-aware* (candidates above 0.95 of
the gold's score dropped, eq. (60)).

Domains: ``wordnet`` (Debian's WordNet: example sentences of synsets) and ``foldoc`` (Debian's
FOLDOC: hyperlinks written inside an encyclopedia's entries, like BLINK's Wikipedia anchors).

    .venv/bin/python -m benchmarks.yardstick --domains wordnet foldoc --seeds 5 --nice 10

writes ``benchmarks/results/yardstick.md`` (and its plot of R@1 on each split against wall-clock).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
import ray
import torch

from benchmarks import harness
from benchmarks.peer.evaluation import HeldOut, embed, held_out_set, ranked_candidates
from hnce.cluster.compute.recall import hits_at, seen_flags
from hnce.cluster.compute.refresh.heldout import training_golds
from hnce.cluster.compute.refresh.initial import prepare_initial_negatives
from hnce.cluster.compute.session import init_ray
from hnce.cluster.stores.index_store import INDEX_DIR
from hnce.cluster.stores.negatives_store import NEGATIVES_DIR
from hnce.cluster.stores.tables import MANIFEST_FILE
from hnce.pipeline.comparison import PairedDifference, paired_difference
from hnce.pipeline.config import Config, load_config
from hnce.pipeline.data.conversion import DatasetOutput
from hnce.pipeline.data.demo_subset import write_demo_subset
from hnce.pipeline.run import refresh_plan
from hnce.pipeline.train.one_process import single_process_group
from hnce.pipeline.train.step import train_step
from hnce.pipeline.train.task import TrainingTask
from hnce.pipeline.train.trainer import initial_request
from hnce.pipeline.train.worker import WorkerRun
from hnce.progress import quiet

logger = logging.getLogger(__name__)

RECIPE = harness.ROOT / "configs" / "demo.yaml"
KS = (1, 8, 64)
EXPOSURES = ("seen", "unseen")
BASELINE = "random + shared"
CACHE = ["negatives.sampler=mixed", "negatives.initial=model", "negatives.cache.enabled=true"]
#: each arm's settings over configs/demo.yaml (the rest of the recipe is the demo's)
ARMS: dict[str, list[str]] = {
    BASELINE: [
        "negatives.sampler=random",
        "negatives.source=none",
        "negatives.initial=random",
        "negatives.cache.enabled=false",
    ],
    "mixed-50, cache": CACHE,
    "mixed-50, cache, no version 0": [
        "negatives.sampler=mixed",
        "negatives.initial=random",
        "negatives.cache.enabled=true",
    ],
    "mixed-50, cache, refresh rows": [*CACHE, "negatives.cache.refresh_rows=64"],
    "mixed-50, cache, whole catalogue": [*CACHE, "negatives.cache.whole_catalogue=true"],
    "random, cache, whole catalogue": [
        *CACHE,
        "negatives.mixed.hard_fraction=0",
        "negatives.cache.whole_catalogue=true",
    ],
    "mixed-50, cache, easy first": [
        *CACHE,
        "negatives.schedule.hard_fraction_by_step=[[0, 0.0], [30, 0.0], [90, 0.5]]",
    ],
    "mixed-50, cache, positive-aware": [*CACHE, "negatives.positive_aware=0.95"],
}


def convert(domain: str, out: Path) -> None:
    """The whole source dataset of ``domain``, converted once into ``out``."""
    if (out / MANIFEST_FILE).is_file():
        return
    if domain == "wordnet":
        from hnce.pipeline.data.wordnet import convert_wordnet

        convert_wordnet(DatasetOutput(out, overwrite=True), Path("/usr/share/wordnet"), 0)
    else:
        from hnce.pipeline.data.foldoc import convert_foldoc

        convert_foldoc(DatasetOutput(out, overwrite=True), Path("/usr/share/dictd"), 0)


def dataset(domain: str, work: Path, args: argparse.Namespace) -> tuple[Path, dict]:
    """The domain's fixed subset (seed 0) under ``work``, and its counts."""
    source = work / f"source-{domain}"
    convert(domain, source)
    subset = work / f"{domain}-subset"
    counts_file = subset.with_suffix(".json")
    if not (subset / MANIFEST_FILE).is_file() or not counts_file.is_file():
        counts = write_demo_subset(
            source,
            subset,
            args.catalogue_entities,
            args.train_mentions,
            args.unseen_mentions,
            "test",
            seed=0,
            seen_mentions=args.seen_mentions,
        )
        harness.write_json(counts_file, counts)
    return subset, json.loads(counts_file.read_text())


def arm_config(work: Path, data: Path, seed: int, arm: str, args: argparse.Namespace) -> Config:
    """configs/demo.yaml on ``data`` at ``seed`` for ``arm``: no refresh, the worker on every
    core, the run in ``work/seed-<seed>/<arm>``."""
    run_dir = work / f"seed-{seed}" / arm.replace(" ", "_").replace(",", "").replace("+", "and")
    overrides = [
        f"run.seed={seed}",
        f"run.dir={run_dir}",
        f"data.root={data}",
        "refresh.enabled=false",
        "training.cores=reserved",
        f"training.cpus_per_worker={torch.get_num_threads()}",
        f"training.steps={args.steps}",
        f"demo.curve_every={args.curve_every}",
    ]
    return load_config(args.recipe, [*overrides, *ARMS[arm]])


def initial_negatives(config: Config, work: Path) -> float:
    """The starting model's index and negatives version 0 copied into ``config``'s run
    directory, built once under ``work`` (the data and the starting model are the same for
    every seed and arm); the seconds building it took."""
    built = work / "version-0"
    seconds_file = built / "seconds.json"
    if not seconds_file.is_file():
        shutil.rmtree(built, ignore_errors=True)
        begun = time.perf_counter()
        encoders = dataclasses.replace(config.refresh, num_encoders=torch.get_num_threads())
        init_ray(config.cluster, encoders.num_encoders * encoders.encoder_cpus)
        try:
            with_encoders = dataclasses.replace(config, refresh=encoders)
            request = initial_request(with_encoders, "model")
            prepare_initial_negatives(refresh_plan(with_encoders), request)
        finally:
            ray.shutdown()
        seconds = time.perf_counter() - begun
        built.mkdir(parents=True)
        for store in (INDEX_DIR, NEGATIVES_DIR):
            shutil.copytree(config.run_dir / store, built / store)
        harness.write_json(seconds_file, {"seconds": seconds})
    else:
        for store in (INDEX_DIR, NEGATIVES_DIR):
            shutil.rmtree(config.run_dir / store, ignore_errors=True)
            shutil.copytree(built / store, config.run_dir / store)
    return json.loads(seconds_file.read_text())["seconds"]


def hits(model: torch.nn.Module, held_out: HeldOut) -> dict[str, list[int]]:
    """Per held-out mention, 1 where a correct entity is among the top k (cosine, exact)."""
    candidates = ranked_candidates(*embed(model, held_out), normalise=True, depth=max(KS))
    found = hits_at(candidates, [m.golds for m in held_out.mentions], KS)
    return {str(k): found[:, j].astype(int).tolist() for j, k in enumerate(KS)}


def train_arm(config: Config, held_out: HeldOut, start_seconds: float) -> dict:
    """Train one arm from the starting model: per-mention hits and wall-clock seconds (training,
    plus ``start_seconds`` of version 0) at every ``demo.curve_every`` steps and the last, and
    the mean seconds a step."""
    curve = {}
    with single_process_group():
        run = WorkerRun.build(
            config, TrainingTask.retriever(config), torch.device("cpu"), 1, lambda *_: None
        )
        run.data.switch(0, None)
        trained = start_seconds
        step_seconds = 0.0
        steps, every = config.training.steps, config.demo.curve_every or config.training.steps
        for step in range(steps):
            run.engine.train()
            begun = time.perf_counter()
            train_step(run.engine, run.data.micro_batches(step, run.device), run.loss)
            took = time.perf_counter() - begun
            trained += took
            step_seconds += took
            if (step + 1) % every == 0 or step + 1 == steps:
                run.engine.eval()
                curve[str(step + 1)] = {
                    "seconds": trained,
                    "hits": hits(run.engine.module.model, held_out),
                }
                logger.info("step %d: %.0f s", step + 1, trained)
    return {"curve": curve, "step_seconds": step_seconds / steps}


def matrix(runs: list[dict], step: str, k: int, rows: np.ndarray) -> np.ndarray:
    """Hits [seeds, mentions in ``rows``] at ``k`` of ``runs`` (one a seed) at ``step``."""
    return np.array([np.asarray(r["curve"][step]["hits"][str(k)])[rows] for r in runs], bool)


def compare(runs: dict[str, list[dict]], step: str, seen: np.ndarray) -> dict:
    """Each arm against random + shared on each split at each k: the paired difference."""
    splits = {"seen": np.flatnonzero(seen), "unseen": np.flatnonzero(~seen)}
    return {
        arm: {
            split: {
                k: paired_difference(
                    matrix(arm_runs, step, k, rows), matrix(runs[BASELINE], step, k, rows)
                )
                for k in KS
            }
            for split, rows in splits.items()
        }
        for arm, arm_runs in runs.items()
        if arm != BASELINE
    }


def recall_cell(arm_runs: list[dict], step: str, k: int, rows: np.ndarray) -> str:
    per_seed = matrix(arm_runs, step, k, rows).mean(axis=1)
    return f"{per_seed.mean():.3f}"


def domain_report(
    domain: str, counts: dict, runs: dict[str, list[dict]], seen: np.ndarray, args
) -> list[str]:
    step = str(args.steps)
    splits = {"seen": np.flatnonzero(seen), "unseen": np.flatnonzero(~seen)}
    differences = compare(runs, step, seen)
    baseline_seconds = statistics.mean(r["curve"][step]["seconds"] for r in runs[BASELINE])
    lines = [
        f"### {domain}",
        "",
        f"{counts['entities']:,} entities, {counts['train_mentions']:,} training mentions, "
        f"{len(splits['seen']):,} seen and {len(splits['unseen']):,} unseen evaluation mentions; "
        f"{len(runs[BASELINE])} paired seeds.",
        "",
        "| arm | split | R@1 | R@8 | R@64 | Δ R@1 [95% CI] | Δ R@8 [95% CI] | Δ R@64 [95% CI] "
        "| MDD R@1 | seconds (×) | s a step |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for arm, arm_runs in runs.items():
        seconds = statistics.mean(r["curve"][step]["seconds"] for r in arm_runs)
        per_step = statistics.mean(r["step_seconds"] for r in arm_runs)
        for split, rows in splits.items():
            recall = [recall_cell(arm_runs, step, k, rows) for k in KS]
            if arm == BASELINE:
                delta = ["—"] * len(KS) + ["—"]
            else:
                paired: dict[int, PairedDifference] = differences[arm][split]
                delta = [paired[k].cell() for k in KS] + [f"{paired[1].detectable:.3f}"]
            lines.append(
                f"| {arm} | {split} | "
                + " | ".join(recall + delta)
                + f" | {seconds:.0f} ({seconds / baseline_seconds:.2f}×) | {per_step:.2f} |"
            )
    lines.append("")
    for arm, by_split in differences.items():
        seconds = statistics.mean(r["curve"][step]["seconds"] for r in runs[arm])
        lines.append(f"- *{arm}*: {goal(by_split, seconds / baseline_seconds)}")
    return lines


def goal(by_split: dict[str, dict[int, PairedDifference]], ratio: float) -> str:
    """The arm against the yardstick's goal: R@1 above random + shared's on seen entities (the
    interval above 0), not below on unseen ones (the interval includes or exceeds 0), R@8 not
    worse on either (its interval includes or exceeds 0), in at most 1.2x its wall-clock."""
    checks = {
        "seen R@1 above 0": by_split["seen"][1].verdict == "above 0",
        "unseen R@1 not below 0": by_split["unseen"][1].verdict != "below 0",
        "R@8 not below 0": all(by_split[split][8].verdict != "below 0" for split in EXPOSURES),
        f"wall-clock {ratio:.2f}x <= 1.2x": ratio <= 1.2,
    }
    met = all(checks.values())
    marks = "; ".join(f"{name} {'yes' if ok else 'NO'}" for name, ok in checks.items())
    return f"{'meets' if met else 'misses'} the goal ({marks})."


def plot(path: Path, results: dict[str, dict[str, list[dict]]], seen_of: dict, steps: int) -> None:
    """One panel per domain and split: each arm's paired difference from random + shared at R@1
    and R@8 with its 95% interval, the arm labelled with its wall-clock against the baseline's."""
    panels = [(domain, split) for domain in results for split in EXPOSURES]
    step = str(steps)
    with harness.plot(path, figsize=(4.2 * len(panels), 3.2), ncols=len(panels)) as (_, axes):
        for axis, (domain, split) in zip(np.atleast_1d(axes), panels, strict=True):
            runs = results[domain]
            differences = compare(runs, step, seen_of[domain])
            baseline = statistics.mean(r["curve"][step]["seconds"] for r in runs[BASELINE])
            labels = []
            for row, (arm, by_split) in enumerate(differences.items()):
                seconds = statistics.mean(r["curve"][step]["seconds"] for r in runs[arm])
                labels.append(f"{arm}\n({seconds / baseline:.2f}x wall-clock)")
                for offset, k, marker in ((-0.12, 1, "o"), (0.12, 8, "s")):
                    paired = by_split[split][k]
                    axis.errorbar(
                        paired.mean,
                        row + offset,
                        xerr=[[paired.mean - paired.low], [paired.high - paired.mean]],
                        fmt=marker,
                        color=f"C{KS.index(k)}",
                        capsize=3,
                        label=f"R@{k}" if row == 0 else None,
                    )
            axis.axvline(0.0, color="grey", linewidth=0.8)
            axis.set_yticks(range(len(labels)), labels, fontsize=7)
            axis.set_ylim(len(labels) - 0.5, -0.5)
            axis.set_title(f"{domain}, {split} entities", fontsize=9)
            axis.set_xlabel("difference from random + shared, 95% CI")
        np.atleast_1d(axes)[0].legend(fontsize=7)


@quiet()
def main() -> None:
    parser = harness.arguments(
        __doc__,
        "yardstick",
        work_dir=Path("/tmp/hnce-yardstick"),
        seeds=5,
        steps=120,
        curve_every=0,
        catalogue_entities=10000,
        train_mentions=1000,
        seen_mentions=2000,
        unseen_mentions=2000,
    )
    parser.add_argument("--domains", nargs="+", choices=["wordnet", "foldoc"], default=["wordnet"])
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS)[:2])
    parser.add_argument(
        "--recipe", type=Path, default=RECIPE, help="the recipe every arm's settings go over"
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: report the arms whose every seed the work directory holds",
    )
    args = harness.parse(parser)
    if BASELINE not in args.arms:
        parser.error(f"--arms must include {BASELINE!r}: every arm is compared with it")
    torch.set_num_threads(2)
    results: dict[str, dict[str, list[dict]]] = {}
    seen_of: dict[str, np.ndarray] = {}
    sections = []
    for domain in args.domains:
        work = args.work_dir / domain
        work.mkdir(parents=True, exist_ok=True)
        data, counts = dataset(domain, args.work_dir, args)
        state = work / "results.json"
        done = json.loads(state.read_text()) if state.is_file() else {}
        held_out = None
        for seed in range(args.seeds):
            for arm in args.arms:
                key = f"{arm} / {seed}"
                if key in done or args.report_only:
                    continue
                config = arm_config(work, data, seed, arm, args)
                held_out = held_out or held_out_set(config)
                shutil.rmtree(config.run_dir, ignore_errors=True)  # an interrupted arm's
                start = (
                    initial_negatives(config, work) if "negatives.initial=model" in ARMS[arm] else 0.0
                )
                done[key] = train_arm(config, held_out, start)
                harness.write_json(state, done)
                shutil.rmtree(config.run_dir, ignore_errors=True)
                logger.info("%s %s done", domain, key)
        config = arm_config(work, data, 0, BASELINE, args)
        mentions = held_out_set(config).mentions
        seen_of[domain] = seen_flags(
            [m.golds for m in mentions], training_golds(data, "train") or set()
        )
        seeds = next(
            (n for n in range(args.seeds) if f"{BASELINE} / {n}" not in done), args.seeds
        )  # with --report-only, the seeds the baseline has run (0..seeds-1)
        results[domain] = {
            arm: [done[f"{arm} / {seed}"] for seed in range(seeds)]
            for arm in args.arms
            if all(f"{arm} / {seed}" in done for seed in range(seeds))
        }
        zero = work / "version-0" / "seconds.json"
        built = json.loads(zero.read_text())["seconds"] if zero.is_file() else None
        sections += [*domain_report(domain, counts, results[domain], seen_of[domain], args)]
        if built is not None:
            sections.append(f"- Version 0 (shared by the arms that start from it): {built:.0f} s.")
        sections.append("")
    plot(args.output.with_suffix(".png"), results, seen_of, args.steps)
    harness.write_result(
        args.output,
        [
            f"# The yardstick (benchmarks/yardstick.py, {args.steps} steps)",
            "",
            f"The demo recipe's model and budget ({args.steps} steps × 8 mentions × 8 negatives, "
            "cosine at temperature 0.05, lr 1e-4, every candidate of a step shared), each arm's "
            "negatives as its name says, the product's training step in one process on "
            f"{torch.get_num_threads()} threads, no refresh, the seeds paired on "
            "fixed data. R@k: mean over seeds. Δ: the arm minus random + shared, mean over seeds "
            "and mentions, with its 95% interval (two-level bootstrap over seeds and mentions); "
            "MDD: the smallest R@1 difference this comparison detects (5%, 80% power). *seconds*: "
            "training and version 0, not evaluation; × random + shared's.",
            "",
            *sections,
            "Commands: "
            + "; ".join(
                f"`.venv/bin/python -m benchmarks.yardstick --domains {domain} --seeds "
                f"{len(runs[BASELINE])} --arms " + " ".join(f"'{arm}'" for arm in runs) + "`"
                for domain, runs in results.items()
            )
            + f", at commit `{harness.commit()}` (the runs kept in the work directory are not run again).",
            "",
            f"![each arm's difference from random + shared]({args.output.stem}.png)",
        ],
    )


if __name__ == "__main__":
    main()
