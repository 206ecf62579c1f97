"""Asynchronous refresh (every checkpoint, or when stale) vs a synchronous refresh every N steps vs negatives mined once: recall against wall-clock.

The comparison the product exists for (ANCE's asynchronous refresh, docs/refresh.md), on real
WordNet with the packaged all-MiniLM-L6-v2, mixed-50 negatives, through ``hnce train``:

- ``async``: the refresh coordinator re-encodes, re-indexes and re-mines beside the trainer,
  which never waits (``refresh.mode: async``), the newest checkpoint every ``--checkpoint-every``
  steps;
- ``stale``: the same coordinator, but only the checkpoints the trainer publishes when the loss
  on its negatives has fallen to ``--stale-ratio`` of the version's first ``--stale-window``
  steps (``refresh.trigger: stale``, hnce.pipeline.train.staleness);
- ``sync``: every ``--sync-every`` steps the trainer publishes a checkpoint and waits for the
  negatives mined with it (``refresh.mode: sync``: the paper's own code, EntQA);
- ``once``: negatives mined once with the starting model before training and never refreshed
  (``refresh.enabled: false``: sentence-transformers' ``mine_hard_negatives``).

All three start from the same negatives version 0 (``negatives.initial: model``) and train the
same steps on the same data order. Every checkpoint is evaluated through the cluster
(``hnce eval``); its wall-clock position is its checkpoint event's time since the run began
(version 0's mining included). Runs and evaluations resume from ``--work-dir``.

    .venv/bin/python -m benchmarks.refresh_modes

writes ``benchmarks/results/refresh_modes.md`` and ``.png``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.training_runs import checkpoint_export
from benchmarks.wordnet_runs import (
    every_checkpoint_kept,
    prepare_dataset,
    recipe,
    wordnet_arguments,
)
from hnce.events import RunEvent
from hnce.pipeline.evaluate import evaluate_export
from hnce.pipeline.event_log import read_events
from hnce.pipeline.train.trainer import run_training
from hnce.progress import quiet


def modes(args: argparse.Namespace) -> dict[str, list[str]]:
    stale = f"stale {args.stale_ratio} over {args.stale_window}"
    return {
        "async": ["refresh.mode=async"],
        stale: [
            "refresh.mode=async",
            "refresh.trigger=stale",
            f"refresh.stale_loss_ratio={args.stale_ratio}",
            f"refresh.stale_window={args.stale_window}",
        ],
        f"sync every {args.sync_every}": [
            "refresh.mode=sync",
            f"refresh.sync_every={args.sync_every}",
        ],
        "once": ["refresh.enabled=false"],
    }


def curve(name: str, overrides: list[str], args: argparse.Namespace, data: Path) -> dict[str, Any]:
    """Train one mode (mixed-50 from negatives version 0) and evaluate every checkpoint: its
    recall against wall-clock seconds since the run began."""
    run_dir = args.work_dir / "runs" / name.replace(" ", "-")
    config = recipe(
        run_dir,
        data,
        *every_checkpoint_kept(args.steps, args.checkpoint_every),
        "training.negatives_check_every=2",
        "negatives.sampler=mixed",
        "negatives.initial=model",
        *overrides,
    )
    began = harness.Timer().epoch
    summary = run_training(config)
    points = []
    for event in read_events(run_dir, RunEvent.CHECKPOINT):
        step = int(event["step"])
        report = evaluate_export(config, checkpoint_export(run_dir, step), name)
        recall = {str(k): value for k, value in report.recall.items()}  # as JSON keeps them
        points.append({"step": step, "seconds": event["time"] - began, **recall})
        print(f"{name} step {step}: R@1 {recall['1']:.3f} at {points[-1]['seconds']:.0f} s")
    return {
        "name": name,
        "points": points,
        "seconds": summary.seconds,
        "refreshes": summary.refreshes,
        "waited": sum(e["seconds"] for e in read_events(run_dir, RunEvent.REFRESH_WAIT)),
        "switches": len(summary.negatives_switches),
    }


def plot_curves(curves: list[dict[str, Any]], png: Path) -> None:
    """Recall@1 and @64 against wall-clock seconds, one line per mode, saved as ``png``."""
    with harness.plot(png, ncols=2, figsize=(10, 4)) as (figure, axes):
        for result in curves:
            seconds = [p["seconds"] for p in result["points"]]
            for axis, k in zip(axes, ("1", "64"), strict=True):
                recall = [p[k] for p in result["points"]]
                axis.plot(seconds, recall, marker="o", label=result["name"])
        for axis, k in zip(axes, ("1", "64"), strict=True):
            axis.set_xlabel("wall-clock seconds since the run began (version 0 included)")
            axis.set_ylabel(f"recall@{k} (held-out lemmas)")
            axis.legend()
        figure.suptitle("Refresh modes through hnce train (WordNet, MiniLM, mixed-50)")


def report_lines(args: argparse.Namespace, curves: list[dict[str, Any]], png: Path) -> list[str]:
    """The result file's markdown lines: the setting, one row per mode, the figure."""
    lines = [
        "# Refresh modes: asynchronous (every checkpoint or when stale) vs synchronous every N "
        "steps vs mined once",
        "",
        f"WordNet subset of {args.entities} synsets, {args.train_mentions} train and "
        f"{args.test_mentions} held-out mentions (lemmas never seen in training); configs/demo.yaml "
        f"(packaged all-MiniLM-L6-v2, mixed-50, 8 mentions × 8 negatives per step, 1 trainer "
        f"worker and 1 encoder actor on 2 shared cores), {args.steps} steps, every run starting from "
        f"negatives version 0 mined with the starting model. Command: "
        f"`.venv/bin/python -m benchmarks.refresh_modes`.",
        "",
        "| mode | seconds | refreshes | seconds waiting | final R@1 | final R@64 | best R@1 (at s) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for result in curves:
        final = result["points"][-1]
        best = max(result["points"], key=lambda p: p["1"])
        lines.append(
            f"| {result['name']} | {result['seconds']:.0f} | {result['refreshes']} | "
            f"{result['waited']:.0f} | {final['1']:.3f} | {final['64']:.3f} | "
            f"{best['1']:.3f} ({best['seconds']:.0f}) |"
        )
    return [*lines, "", f"![recall against wall-clock]({png.name})"]


@quiet()  # no progress bars from hnce in this process
def main() -> None:
    parser = wordnet_arguments(
        __doc__, "refresh_modes", Path("runs/refresh-modes"), 2000, steps=60, checkpoint_every=10
    )
    parser.add_argument("--sync-every", type=int, default=20, help="steps between sync refreshes")
    parser.add_argument("--stale-ratio", type=float, default=0.8, help="refresh.stale_loss_ratio")
    parser.add_argument("--stale-window", type=int, default=5, help="refresh.stale_window")
    args = harness.parse(parser)
    data = prepare_dataset(args.work_dir, args.entities, args.train_mentions, args.test_mentions)
    state = harness.StageState(args.work_dir / "state.json").load()
    curves = [
        state.once(name, lambda n=name, o=overrides: curve(n, o, args, data))
        for name, overrides in modes(args).items()
    ]
    png = args.output.with_suffix(".png")
    plot_curves(curves, png)
    harness.write_result(args.output, report_lines(args, curves, png))


if __name__ == "__main__":
    main()
