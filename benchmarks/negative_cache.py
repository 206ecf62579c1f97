"""Hard negatives from the negative cache against random + shared and mined-once, on the demo.

Three arms of the product's training step (:class:`~hnce.pipeline.train.worker.WorkerRun`, its
DeepSpeed engine and :func:`~hnce.pipeline.train.step.train_step` over the worker's own
micro-batches) on configs/demo.yaml's data, in one process on every core, seeds 0..N-1:

- *random + shared*: the demo's random run (uniform negatives, every candidate of the step shared);
- *mixed-50, cache*: ``negatives.cache.enabled``, filled from the starting model's index version 0
  and written by every step (and ``--refresh-rows`` re-encoded a step), no refresh;
- *mixed-50, mined once*: the starting model's negatives version 0 for the whole run (the
  sentence-transformers way).

Version 0 is the product's own (:func:`~hnce.pipeline.train.version_zero.prepare_initial_negatives`,
the encoder actors under Ray), built once per seed (one encoder actor a core) and copied into both
mixed arms; its seconds count towards both arms' wall-clock. Recall by exact evaluation of the held-out mentions (lemmas
training never saw) every ``demo.curve_every`` steps. Each arm's share of hard negatives whose
vectors were under 10 steps old comes from the worker's own counts (``fresh_hard_negatives``).
The asynchronous refresh needs Ray Train and the refresh coordinator; it is measured by
``benchmarks/demo_seeds.py`` (the demo itself) and quoted, not rerun, here.

    .venv/bin/python -m benchmarks.negative_cache --seeds 3 --nice 10
    .venv/bin/python -m benchmarks.negative_cache --seeds 3 --steps 120 --learning-rate 1e-4 \\
        --curve-every 60 --arms "random + shared" "mixed-50, cache" \\
        --output benchmarks/results/negative_cache_long.md --nice 10

writes ``benchmarks/results/negative_cache.md`` and its plot of R@1 against wall-clock.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import ray
import torch

from benchmarks import harness
from benchmarks.peer.evaluation import exact_recall, held_out_set
from benchmarks.wordnet_comparison import spread, welch_t
from hnce.cluster.compute.session import init_ray
from hnce.cluster.stores.index_store import INDEX_DIR
from hnce.cluster.stores.negatives_store import NEGATIVES_DIR
from hnce.pipeline.config import Config, load_config
from hnce.pipeline.demo import demo_dataset
from hnce.pipeline.train.one_process import single_process_group
from hnce.pipeline.train.step import train_step
from hnce.pipeline.train.task import TrainingTask
from hnce.pipeline.train.version_zero import prepare_initial_negatives
from hnce.pipeline.train.worker import WorkerRun
from hnce.progress import quiet

logger = logging.getLogger(__name__)

RECIPE = harness.ROOT / "configs" / "demo.yaml"
KS = (1, 8, 64)
BASELINE = "random + shared"
ARMS = {
    BASELINE: [
        "negatives.sampler=random",
        "negatives.source=none",
        "negatives.initial=random",
        "negatives.cache.enabled=false",
    ],
    "mixed-50, cache": ["negatives.initial=model", "negatives.cache.enabled=true"],
    "mixed-50, mined once": ["negatives.initial=model", "negatives.cache.enabled=false"],
}


def arm_config(work: Path, seed: int, arm: str, args: argparse.Namespace) -> Config:
    """configs/demo.yaml at ``seed`` for ``arm``: no refresh, the worker on every core; the demo
    data converted and cut once per seed (in ``work/seed-<seed>``), each arm its own run."""
    seed_dir = work / f"seed-{seed}"
    overrides = [
        f"run.seed={seed}",
        "refresh.enabled=false",
        "training.cores=reserved",
        f"training.cpus_per_worker={torch.get_num_threads()}",
        f"training.steps={args.steps}",
        f"training.learning_rate={args.learning_rate}",
        f"demo.curve_every={args.curve_every}",
        f"negatives.cache.refresh_rows={args.refresh_rows}",
    ]
    data = seed_dir / "wordnet-demo"
    if not (data / "entities").is_dir():
        demo_dataset(load_config(RECIPE, [*overrides, f"run.dir={seed_dir}"]))
    run_dir = seed_dir / arm.replace(" ", "_").replace(",", "").replace("+", "and")
    return load_config(RECIPE, [*overrides, *ARMS[arm], f"run.dir={run_dir}", f"data.root={data}"])


def version_zero(config: Config, work: Path) -> float:
    """The starting model's index and negatives version 0 in ``config``'s run directory, built
    once per seed under ``work`` and copied; the seconds building it took."""
    built = work / "version-0"
    seconds_file = built / "seconds.json"
    if not seconds_file.is_file():
        shutil.rmtree(built, ignore_errors=True)
        begun = time.perf_counter()
        encoders = dataclasses.replace(config.refresh, num_encoders=torch.get_num_threads())
        init_ray(config.cluster, encoders.num_encoders * encoders.encoder_cpus)
        try:
            prepare_initial_negatives(dataclasses.replace(config, refresh=encoders), "model")
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


def train_arm(config: Config, start_seconds: float) -> dict:
    """Train one arm from the starting model: recall and wall-clock seconds (training only, plus
    ``start_seconds`` of version 0) at every ``demo.curve_every`` steps, and its hard and fresh
    negatives."""
    held_out = held_out_set(config)
    curve = {}
    with single_process_group():
        run = WorkerRun.build(
            config, TrainingTask.retriever(config), torch.device("cpu"), 1, lambda *_: None
        )
        run.data.switch(0, None)
        trained = start_seconds
        steps, every = config.training.steps, config.demo.curve_every
        for step in range(steps):
            run.engine.train()
            begun = time.perf_counter()
            train_step(run.engine, run.data.micro_batches(step, run.device), run.loss)
            trained += time.perf_counter() - begun
            if (step + 1) % every == 0 or step + 1 == steps:
                run.engine.eval()
                recall = exact_recall(run.engine.module.model, held_out, normalise=True)
                curve[str(step + 1)] = {"seconds": trained, **{str(k): recall[k] for k in KS}}
                logger.info("step %d: %s", step + 1, curve[str(step + 1)])
        drawn = run.data.freshness.totals
    return {"curve": curve, "hard": drawn.hard, "fresh": drawn.fresh, "age": drawn.mean_age}


def report(results: dict[str, dict], args: argparse.Namespace) -> list[str]:
    seeds = sorted(results, key=int)
    final = str(args.steps)
    steps = sorted({int(s) for seed in seeds for s in results[seed][BASELINE]["curve"]})
    table = [
        "| arm | step | seconds | R@1 | R@8 | R@64 | fresh hard negatives | their mean age |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for arm in args.arms:
        for step in steps:
            points = [results[s][arm]["curve"][str(step)] for s in seeds]
            cells = [spread([p[str(k)] for p in points]) for k in KS]
            seconds = sum(p["seconds"] for p in points) / len(points)
            hard = sum(results[s][arm]["hard"] for s in seeds)
            fresh = sum(results[s][arm]["fresh"] for s in seeds)
            share = f"{fresh / hard:.0%} of {hard // len(seeds):,}" if hard else "—"
            ages = [a for s in seeds if (a := results[s][arm].get("age")) is not None]
            age = f"{statistics.mean(ages):.1f} steps" if ages else "—"
            table.append(
                f"| {arm} | {step} | {seconds:.0f} | " + " | ".join(cells) + f" | {share} | {age} |"
            )
    lines = []
    for arm in [a for a in args.arms if a != BASELINE]:
        t = {
            k: welch_t(
                [results[s][arm]["curve"][final][str(k)] for s in seeds],
                [results[s][BASELINE]["curve"][final][str(k)] for s in seeds],
            )
            for k in KS
        }
        differences = {
            k: [
                results[s][arm]["curve"][final][str(k)]
                - results[s][BASELINE]["curve"][final][str(k)]
                for s in seeds
            ]
            for k in KS
        }
        paired = statistics.mean(differences[1]) / (
            statistics.stdev(differences[1]) / math.sqrt(len(seeds))
        )
        per_seed = "; ".join(
            f"seed {s}: {results[s][BASELINE]['curve'][final]['1']:.3f} → "
            f"{results[s][arm]['curve'][final]['1']:.3f}"
            for s in seeds
        )
        verdict = {
            True: "beats random + shared at R@1 beyond the seeds' spread",
            False: "loses to random + shared at R@1 beyond the seeds' spread",
            None: "is within the seeds' spread of random + shared at R@1",
        }[True if t[1] > 2 else (False if t[1] < -2 else None)]
        lines.append(
            f"- *{arm}* − *{BASELINE}* at step {final}: Welch's t "
            + ", ".join(f"R@{k} {t[k]:+.1f}" for k in KS)
            + f" ({per_seed}): it {verdict}. Paired by seed (the same data and mention "
            f"order), R@1 moves by {statistics.mean(differences[1]):+.3f}, paired t "
            f"{paired:+.1f}; the difference per seed, mean ± sd: "
            + ", ".join(
                f"R@{k} {statistics.mean(d):+.3f} ± {statistics.stdev(d):.3f}"
                for k, d in differences.items()
            )
            + f". {reach(results, arm, seeds)}"
        )
    return [
        f"# Hard negatives from the negative cache (benchmarks/negative_cache.py, {args.steps} "
        f"steps at lr {args.learning_rate:g})",
        "",
        f"configs/demo.yaml's data (8,000 synsets, 400 held-out mentions of lemmas training never "
        f"saw), {args.steps} steps × 8 mentions × 8 negatives, lr {args.learning_rate:g}, cosine "
        f"at temperature 0.05, shared negatives; the product's training step in one process on "
        f"{torch.get_num_threads()} threads; no refresh. The mixed arms start from the starting "
        "model's version 0 (its seconds are in theirs); the cache arm then mines every step from "
        f"the cache its steps write ({args.refresh_rows} rows re-encoded a step). Seeds "
        f"0..{len(seeds) - 1} (data, order, draws, dropout); mean ± sd. *seconds*: training and "
        "version 0, not evaluation. *fresh*: hard negatives whose vectors were under 10 steps "
        "old, of those drawn a run; *their mean age*: of all of them, in steps (over the seeds that "
        "recorded it).",
        "",
        *table,
        "",
        *lines,
        "",
        f"![R@1 against wall-clock]({args.output.stem}.png)",
    ]


def reach(results: dict[str, dict], arm: str, seeds: list[str]) -> str:
    """When ``arm`` first reached random + shared's final mean R@1, against random + shared's
    seconds (both means over the seeds, at the evaluated steps)."""

    def mean_curve(name: str) -> list[tuple[int, float, float]]:
        steps = sorted(results[seeds[0]][name]["curve"], key=int)
        points = [[results[s][name]["curve"][step] for s in seeds] for step in steps]
        return [
            (
                int(step),
                statistics.mean(p["seconds"] for p in point),
                statistics.mean(p["1"] for p in point),
            )
            for step, point in zip(steps, points, strict=True)
        ]

    _, baseline_seconds, target = mean_curve(BASELINE)[-1]
    for step, seconds, recall in mean_curve(arm):
        if recall >= target:
            return (
                f"It reached random + shared's final R@1 ({target:.3f}) at step {step}, "
                f"{seconds:.0f} s: {seconds / baseline_seconds:.2f}× random + shared's "
                f"{baseline_seconds:.0f} s."
            )
    return f"It never reached random + shared's final R@1 ({target:.3f}) at an evaluated step."


def plot(results: dict[str, dict], arms: list[str], path: Path) -> None:
    """Mean R@1 (± sd over the seeds) against mean wall-clock seconds, one line per arm."""
    seeds = sorted(results, key=int)
    with harness.plot(path, figsize=(6, 4)) as (_, axes):
        for arm in arms:
            steps = sorted(results[seeds[0]][arm]["curve"], key=int)
            points = [[results[s][arm]["curve"][step] for s in seeds] for step in steps]
            seconds = [statistics.mean(p["seconds"] for p in step) for step in points]
            recall = [[p["1"] for p in step] for step in points]
            axes.errorbar(
                seconds,
                [statistics.mean(r) for r in recall],
                yerr=[statistics.stdev(r) for r in recall],
                marker="o",
                capsize=3,
                label=arm,
            )
        axes.set_xlabel("seconds (training and version 0)")
        axes.set_ylabel(f"R@1, mean ± sd over {len(seeds)} seeds")
        axes.legend()


@quiet()
def main() -> None:
    parser = harness.arguments(
        __doc__, "negative_cache", work_dir=None, seeds=3, steps=60, curve_every=30
    )
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--refresh-rows", type=int, default=0)
    parser.add_argument(
        "--arms", nargs="+", choices=list(ARMS), default=list(ARMS), help="arms to run"
    )
    args = harness.parse(parser)
    if BASELINE not in args.arms:
        parser.error(f"--arms must include {BASELINE!r}: every arm is compared with it")
    if args.seeds < 2:
        parser.error("--seeds must be at least 2: the report is mean ± sd over seeds")
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory(prefix="hnce-negative-cache-") as scratch:
        work = Path(args.work_dir or scratch)
        state = work / "results.json"
        results = json.loads(state.read_text()) if state.is_file() else {}
        for seed in range(args.seeds):
            seed_results = results.setdefault(str(seed), {})
            for arm in args.arms:
                if arm in seed_results:
                    continue
                config = arm_config(work, seed, arm, args)
                shutil.rmtree(config.run_dir, ignore_errors=True)  # an interrupted arm's
                start = 0.0
                if "negatives.initial=model" in ARMS[arm]:
                    start = version_zero(config, work / f"seed-{seed}")
                seed_results[arm] = train_arm(config, start)
                harness.write_json(state, results)
        results = {s: results[s] for s in map(str, range(args.seeds))}
        plot(results, args.arms, args.output.with_suffix(".png"))
        harness.write_result(args.output, report(results, args))


if __name__ == "__main__":
    main()
