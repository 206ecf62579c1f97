"""What held-out recall costs a refresh (``refresh.heldout_recall``, docs/refresh.md).

A refresh encodes the whole catalogue into a new index version anyway; scoring the eval split's
mentions against that index adds only their encoding and search. This benchmark trains a
checkpoint on the WordNet subset (``configs/demo.yaml``, the packaged all-MiniLM-L6-v2), then
refreshes from it in this process twice, held-out recall on and off, each into a fresh copy of
the run, and reports each stage's seconds from the refresh's own summary: the held-out stage
against the catalogue's encoding and the whole refresh. The recall it logs is checked equal to
``hnce eval`` of the same checkpoint, which reuses that index.

    .venv/bin/python -m benchmarks.heldout_recall_cost

writes ``benchmarks/results/heldout_recall_cost.md``.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.wordnet_runs import prepare_dataset, recipe, wordnet_arguments
from hnce.cluster.compute.refresh.engine import run_refresh
from hnce.cluster.compute.session import init_ray
from hnce.pipeline.config import Config
from hnce.pipeline.evaluate import evaluate_checkpoint
from hnce.pipeline.run import refresh_plan
from hnce.pipeline.train.trainer import run_training
from hnce.progress import quiet

STEPS = 2


def trained_run(args: argparse.Namespace, data: Path) -> Path:
    """A run with one checkpoint (step ``STEPS``) and no refresh of its own."""
    run_dir = args.work_dir / "trained"
    config = recipe(
        run_dir,
        data,
        f"training.steps={STEPS}",
        f"training.checkpoint_every={STEPS}",
        "refresh.enabled=false",
        "negatives.sampler=random",
        "negatives.cache.enabled=false",
        "negatives.initial=random",
    )
    if not (run_dir / "checkpoints" / f"step-{STEPS}").is_dir():
        shutil.rmtree(run_dir, ignore_errors=True)
        run_training(config)
    return run_dir


def refreshed(args: argparse.Namespace, data: Path, trained: Path, heldout: bool) -> dict:
    """One refresh of step ``STEPS`` into a fresh copy of the trained run: its stage seconds,
    held-out figures, and (held-out on) ``hnce eval``'s recall of the same checkpoint."""
    run_dir = args.work_dir / ("heldout-on" if heldout else "heldout-off")
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.copytree(trained, run_dir, ignore=shutil.ignore_patterns("ray"))
    config = recipe(
        run_dir, data, f"refresh.heldout_recall={str(heldout).lower()}", "refresh.enabled=true"
    )
    init_ray(config.cluster, config.refresh.num_encoders * config.refresh.encoder_cpus)
    summary = run_refresh(refresh_plan(config), STEPS)
    result: dict[str, Any] = {"seconds": dict(summary.seconds), "entities": summary.num_entities}
    if summary.heldout is not None:
        result["heldout_seconds"] = summary.heldout.seconds
        result["mentions"] = summary.heldout.mentions
        result["recall"] = summary.heldout.recall
        result["eval_recall"] = _eval_recall(config)
    shutil.rmtree(run_dir)  # a copy of the run with DeepSpeed state and an index: not kept
    return result


def _eval_recall(config: Config) -> dict[str, float]:
    report = evaluate_checkpoint(config, f"{config.run_dir}/checkpoints/step-{STEPS}")
    return {str(k): value for k, value in report.recall.items()}


def report_lines(args: argparse.Namespace, on: dict, off: dict) -> list[str]:
    """The result file: the setting, the stages of both refreshes, the ratios."""
    heldout = on["heldout_seconds"]
    encode = on["seconds"].get("index", 0.0)
    equal = on["recall"] == on["eval_recall"]
    stages = sorted(set(on["seconds"]) | set(off["seconds"]))
    rows = [
        f"| {stage} | {off['seconds'].get(stage, 0.0):.1f} | {on['seconds'].get(stage, 0.0):.1f} |"
        for stage in stages
    ]
    recall = ", ".join(f"R@{k} {v:.3f}" for k, v in on["recall"].items())
    return [
        "# Held-out recall in each refresh: its cost",
        "",
        f"WordNet subset of {args.entities} synsets ({on['entities']} in the catalogue), "
        f"{on['mentions']} held-out mentions; configs/demo.yaml (packaged all-MiniLM-L6-v2, one "
        f"encoder actor), a refresh of a {STEPS}-step checkpoint, in one process on this "
        f"machine's 2 cores. Command: `.venv/bin/python -m benchmarks.heldout_recall_cost`.",
        "",
        "| stage (seconds) | held-out off | held-out on |",
        "|---|---:|---:|",
        *rows,
        "",
        f"Held-out recall took {heldout:.1f} s: {heldout / encode:.2f}x the catalogue's "
        f"encoding ({encode:.1f} s) and {heldout / on['seconds']['total']:.1%} of the refresh "
        f"with it on; it grows with `data.max_eval_mentions`, not with the catalogue. It logged "
        f"{recall}; `hnce eval` of the same checkpoint (reusing that index) "
        f"{'reported exactly the same' if equal else 'DIFFERED: ' + str(on['eval_recall'])}.",
    ]


@quiet()  # no progress bars from hnce in this process
def main() -> None:
    parser = wordnet_arguments(
        __doc__, "heldout_recall_cost", Path("runs/heldout-recall-cost"), 2000
    )
    args = harness.parse(parser)
    data = prepare_dataset(args.work_dir, args.entities, args.train_mentions, args.test_mentions)
    trained = trained_run(args, data)
    off = refreshed(args, data, trained, heldout=False)
    on = refreshed(args, data, trained, heldout=True)
    harness.write_result(args.output, report_lines(args, on, off))


if __name__ == "__main__":
    main()
