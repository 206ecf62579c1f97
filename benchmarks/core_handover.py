"""Trainer and refresh sharing one machine's cores: ``training.cores`` reserved against handover.

The demo's WordNet subset and recipe (configs/demo.yaml: all-MiniLM-L6-v2, one trainer worker
and one encoder actor of one CPU each on this 2-core machine), trained by ``hnce train`` as a
child process, once per cell:

- random negatives, no refresh: with ``reserved`` the trainer runs on 1 thread and the second
  core idles for the whole run; with ``handover`` it runs on both;
- mixed-50 on the asynchronous refresh (version 0 from the model, a checkpoint every
  ``--checkpoint-every`` steps): with ``handover`` the trainer runs on both cores whenever no
  refresh is encoding or mining, and on one while one is;
- the same with ``refresh.trigger: stale`` (a refresh only when the negatives went stale), where
  the refresh idles longer;
- mixed-50 on synchronous refreshes (``refresh.mode: sync``, every ``--checkpoint-every`` steps):
  with ``handover`` the waiting trainer also lends its thread to each refresh's encoder.

Both runs of a recipe are measured in one invocation; ``--recipes`` re-measures some recipes and
keeps the others' rows (``<output>.json``).

Every step is logged (its seconds and the torch threads it ran on), so the table gives each
cell's mean step at 1 and at 2 threads, the share of steps on 2, the seconds inside the steps
and the whole command, the refreshes published and the negatives versions used.

    python -m benchmarks.core_handover [--steps 60] [--checkpoint-every 15] [--recipes sync]

writes ``benchmarks/results/core_handover.md``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.training_runs import published_refreshes
from hnce.cluster.stores.run_events import read_events
from hnce.events import RunEvent
from hnce.pipeline.config import load_config
from hnce.pipeline.demo import demo_dataset
from hnce.progress import quiet

RECIPE = harness.ROOT / "configs" / "demo.yaml"
CORES = ("reserved", "handover")
#: the recipes compared: the demo's own (mixed-50 on the refresh) and random without a refresh
RECIPES = {
    "random, no refresh": {
        "negatives.sampler": "random",
        "negatives.initial": "random",
        "refresh.enabled": "false",
    },
    "mixed-50, async refresh": {},
    "mixed-50, stale trigger": {"refresh.trigger": "stale"},
    "mixed-50, sync refresh": {"refresh.mode": "sync"},
}


def train(work: Path, data_root: Path, recipe: str, cores: str, args: Any) -> dict[str, Any]:
    """One ``hnce train`` of the demo recipe with ``training.cores: cores``; what it did."""
    run_dir = work / f"{recipe.replace(', ', '-').replace(' ', '-')}-{cores}"
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides = {
        "run.dir": run_dir,
        "data.root": data_root,
        "training.cores": cores,
        "training.steps": args.steps,
        "training.checkpoint_every": args.checkpoint_every,
        "training.log_every": 1,
        **RECIPES[recipe],
    }
    command = harness.run_recipe("train", RECIPE, overrides, log=work / "commands.log")
    steps = read_events(run_dir, RunEvent.STEP)
    by_threads: dict[int, list[float]] = {}
    for event in steps:
        by_threads.setdefault(int(event["threads"]), []).append(float(event["seconds"]))
    row = {
        "cores": read_events(run_dir, RunEvent.LAUNCH)[0]["cores"],
        "command seconds": command.seconds,
        "step seconds": sum(sum(values) for values in by_threads.values()),
        "mean step by threads": {t: sum(v) / len(v) for t, v in sorted(by_threads.items())},
        "steps by threads": {t: len(v) for t, v in sorted(by_threads.items())},
        "refreshes published": len(published_refreshes(run_dir)),
        "versions used": len(read_events(run_dir, RunEvent.NEGATIVES)),
        "waiting seconds": sum(e["seconds"] for e in read_events(run_dir, RunEvent.REFRESH_WAIT)),
    }
    shutil.rmtree(run_dir)
    return row


def table(rows: dict[str, dict[str, Any]]) -> list[str]:
    """The result's markdown table, one line per (recipe, cores) cell."""
    lines = [
        "| recipe | training.cores | whole command s | inside steps s | step s on 1 thread "
        "| step s on 2 threads | steps on 2 threads | waiting for refreshes s | refreshes published "
        "| negatives versions trained on (v0 included) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for cell, row in rows.items():
        recipe = cell.rsplit(" / ", 1)[0]
        means, counts = row["mean step by threads"], row["steps by threads"]
        on_two = counts.get(2, 0) / sum(counts.values())
        one, two = (f"{means[t]:.2f}" if t in means else "—" for t in (1, 2))
        lines.append(
            f"| {recipe} | {row['cores']} | {row['command seconds']:.0f} "
            f"| {row['step seconds']:.0f} | {one} | {two} | {on_two:.0%} "
            f"| {row.get('waiting seconds', 0.0):.0f} "
            f"| {row['refreshes published']} | {row['versions used']} |"
        )
    return lines


@quiet()
def main() -> None:
    parser = harness.arguments(
        __doc__, "core_handover", work_dir=None, steps=60, checkpoint_every=15
    )
    parser.add_argument(
        "--recipes",
        nargs="+",
        default=None,
        help="measure only the recipes with one of these words in their name (default: all)",
    )
    args = harness.parse(parser)
    work = Path(args.work_dir)
    config, _ = demo_dataset(load_config(RECIPE, [f"run.dir={work}"]))
    data_root = Path(config.data.root)
    state_path = args.output.with_suffix(".json")
    rows = json.loads(state_path.read_text()) if state_path.is_file() else {}
    for row in rows.values():  # JSON keys are strings
        for key in ("mean step by threads", "steps by threads"):
            row[key] = {int(threads): value for threads, value in row[key].items()}
    chosen = [
        r
        for r in RECIPES
        if args.recipes is None or set(args.recipes) & set(r.replace(",", "").split())
    ]
    for recipe in chosen:
        for cores in CORES:
            rows[f"{recipe} / {cores}"] = train(work, data_root, recipe, cores, args)
    rows = {
        f"{r} / {c}": rows[f"{r} / {c}"] for r in RECIPES for c in CORES if f"{r} / {c}" in rows
    }
    harness.write_json(state_path, rows)
    measured = [r for r in RECIPES if f"{r} / reserved" in rows]
    ratios = [
        f"- {recipe}: handover / reserved, whole command "
        f"{rows[f'{recipe} / handover']['command seconds'] / rows[f'{recipe} / reserved']['command seconds']:.2f}, "
        f"inside the steps "
        f"{rows[f'{recipe} / handover']['step seconds'] / rows[f'{recipe} / reserved']['step seconds']:.2f}"
        for recipe in measured
    ]
    lines = [
        "# Trainer and refresh on one machine's cores (benchmarks/core_handover.py)",
        "",
        f"The demo recipe (configs/demo.yaml: WordNet subset of 8,000 synsets, all-MiniLM-L6-v2, "
        f"one trainer worker and one encoder actor of 1 CPU each) trained {args.steps} steps "
        f"(checkpoint every {args.checkpoint_every}) by `hnce train` on this 2-core machine, one "
        f"run per cell, both runs of a recipe in one invocation. `reserved`: the trainer runs on "
        f"`cpus_per_worker` (1) threads; `handover`: on both cores while no refresh is encoding "
        f"or mining, on 1 while one is (`training.cores`, the default `auto` is `handover` on a "
        f"one-node CPU cluster); with `refresh.mode: sync` the waiting trainer also lends its "
        f"thread to each refresh's encoder.",
        "",
        *table(rows),
        "",
        *ratios,
    ]
    harness.write_result(args.output, lines)


if __name__ == "__main__":
    main()
