"""Asynchronous refresh vs a synchronous refresh every N steps vs negatives mined once: recall against wall-clock.

The comparison the product exists for (ANCE's asynchronous refresh, docs/refresh.md), on real
WordNet with the packaged all-MiniLM-L6-v2, mixed-50 negatives, through ``hnce train``:

- ``async``: the refresh coordinator re-encodes, re-indexes and re-mines beside the trainer,
  which never waits (``refresh.mode: async``);
- ``sync``: every ``--sync-every`` steps the trainer publishes a checkpoint and waits for the
  negatives mined with it (``refresh.mode: sync``: the paper's own code, EntQA);
- ``once``: negatives mined once with the starting model before training and never refreshed
  (``refresh.enabled: false``: sentence-transformers' ``mine_hard_negatives``).

All three start from the same negatives version 0 (``negatives.initial: model``) and train the
same steps on the same data order. Every checkpoint is evaluated through the cluster
(``hnce eval``); its wall-clock position is its checkpoint event's time since the run began
(version 0's mining included). Runs and evaluations resume from ``--work-dir``.

    .venv/bin/python benchmarks/refresh_modes.py

writes ``benchmarks/results/refresh_modes.md`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from report import write_result
from wordnet_runs import checkpoint_export, prepare_dataset, recipe

from hnce.pipeline.evaluate import evaluate_export
from hnce.pipeline.train.events import read_events
from hnce.pipeline.train.trainer import run_training

RESULTS = Path(__file__).resolve().parent / "results"


def modes(sync_every: int) -> dict[str, list[str]]:
    return {
        "async": ["refresh.mode=async"],
        f"sync every {sync_every}": ["refresh.mode=sync", f"refresh.sync_every={sync_every}"],
        "once": ["refresh.enabled=false"],
    }


def curve(name: str, overrides: list[str], args: argparse.Namespace, data: Path) -> dict:
    """Train one mode and evaluate every checkpoint; kept as JSON under the work dir."""
    path = args.work_dir / "curves" / f"{name.replace(' ', '-')}.json"
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    run_dir = args.work_dir / "runs" / name.replace(" ", "-")
    config = recipe(
        run_dir,
        data,
        f"training.steps={args.steps}",
        f"training.checkpoint_every={args.checkpoint_every}",
        f"training.keep_checkpoints={args.steps // args.checkpoint_every + 1}",
        "training.negatives_check_every=2",
        "negatives.sampler=mixed",
        "negatives.initial=model",
        *overrides,
    )
    began = time.time()
    summary = run_training(config, progress=False)
    points = []
    for event in read_events(run_dir, "checkpoint"):
        step = int(event["step"])
        report = evaluate_export(config, checkpoint_export(run_dir, step), name, progress=False)
        recall = {str(k): value for k, value in report.recall.items()}  # as JSON keeps them
        points.append({"step": step, "seconds": event["time"] - began, **recall})
        print(f"{name} step {step}: R@1 {recall['1']:.3f} at {points[-1]['seconds']:.0f} s")
    waits = sum(e["seconds"] for e in read_events(run_dir, "refresh_wait"))
    result = {
        "name": name,
        "points": points,
        "seconds": summary.seconds,
        "refreshes": summary.refreshes,
        "waited": waits,
        "switches": len(summary.negatives_switches),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work-dir", type=Path, default=Path("runs/refresh-modes"))
    parser.add_argument("--entities", type=int, default=2000)
    parser.add_argument("--train-mentions", type=int, default=1000)
    parser.add_argument("--test-mentions", type=int, default=300)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--sync-every", type=int, default=20)
    parser.add_argument("--out", type=Path, default=RESULTS / "refresh_modes.md")
    args = parser.parse_args()
    data = prepare_dataset(args.work_dir, args.entities, args.train_mentions, args.test_mentions)
    curves = [curve(name, o, args, data) for name, o in modes(args.sync_every).items()]
    png = args.out.with_suffix(".png")
    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    for result in curves:
        seconds = [p["seconds"] for p in result["points"]]
        for axis, k in zip(axes, ("1", "64"), strict=True):
            axis.plot(seconds, [p[k] for p in result["points"]], marker="o", label=result["name"])
    for axis, k in zip(axes, ("1", "64"), strict=True):
        axis.set_xlabel("wall-clock seconds since the run began (version 0 included)")
        axis.set_ylabel(f"recall@{k} (held-out lemmas)")
        axis.legend()
    figure.suptitle("Refresh modes through hnce train (WordNet, MiniLM, mixed-50)")
    figure.tight_layout()
    figure.savefig(png, dpi=120)
    plt.close(figure)
    lines = [
        "# Refresh modes: asynchronous vs synchronous every N steps vs mined once",
        "",
        f"WordNet subset of {args.entities} synsets, {args.train_mentions} train and "
        f"{args.test_mentions} held-out mentions (lemmas never seen in training); configs/demo.yaml "
        f"(packaged all-MiniLM-L6-v2, mixed-50, 8 mentions × 8 negatives per step, 1 trainer "
        f"worker and 1 encoder actor on 2 shared cores), {args.steps} steps, every run starting from "
        f"negatives version 0 mined with the starting model. Command: "
        f"`.venv/bin/python benchmarks/refresh_modes.py`.",
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
    lines += ["", f"![recall against wall-clock]({png.name})"]
    write_result(args.out, lines)


if __name__ == "__main__":
    main()
