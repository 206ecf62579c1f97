"""The demo at several seeds: does its mixed-50 run beat its random run beyond the seeds' spread?

``hnce demo`` (configs/demo.yaml as shipped, or with ``--set`` overrides) once per seed
0..``--seeds``-1, each in its own run directory under ``--work-dir`` (a seed whose
``demo_results.json`` is there is not run again). The
seed (``run.seed``) draws the WordNet subset and the held-out mentions as well as the data order,
the negatives and the dropout, so the spread is that of a user re-running the demo with another
seed. The report: each run's final R@1/R@8/R@64 as mean ± sd, Welch's t of mixed-50 against
random, R@1 and R@8 at every evaluated checkpoint (the demo's ``demo.curve_every``), and the demo's
seconds per stage.

    .venv/bin/python -m benchmarks.demo_seeds --seeds 3 --work-dir /work/demo-seeds
    .venv/bin/python -m benchmarks.demo_seeds --seeds 3 --work-dir /work/demo-seeds-120 \\
        --set training.steps=120 --set training.learning_rate=1e-4 \\
        --set training.keep_checkpoints=8 --output benchmarks/results/demo_seeds_120.md

writes ``benchmarks/results/demo_seeds.md``.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.wordnet_comparison import spread, welch_t
from hnce.pipeline.config import load_config
from hnce.pipeline.demo import CURVE_FILE, run_demo

RECIPE = harness.ROOT / "configs" / "demo.yaml"
KS = (1, 8, 64)
RUNS = ("random", "mixed-50")


def run_seed(work: Path, seed: int, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The demo at ``seed`` with the recipe's ``overrides`` (kept from an earlier invocation when
    its results are there: give each recipe its own ``work``): final recall per run, its curve
    and its seconds per stage."""
    run_dir = work / f"seed-{seed}"
    results = run_dir / "demo_results.json"
    if not results.is_file():
        run_demo(load_config(RECIPE, [*overrides, f"run.dir={run_dir}", f"run.seed={seed}"]))
    reports = json.loads(results.read_text())
    return {
        "recall": {  # "untrained", and each run's final checkpoint as "trained, <run>"
            r["name"].removeprefix("trained, "): {int(k): v for k, v in r["recall"].items()}
            for r in reports
        },
        "curve": json.loads((run_dir / CURVE_FILE).read_text()),
        "seconds": json.loads((run_dir / "demo_timings.json").read_text()),
    }


def recall_rows(seeds: list[dict[str, Any]]) -> list[str]:
    """Mean ± sd of each run's final recall, and Welch's t of mixed-50 against random."""
    rows = ["| run | " + " | ".join(f"R@{k}" for k in KS) + " |", "|---|" + "---:|" * len(KS)]
    for name in ("untrained", *RUNS):
        cells = [spread([seed["recall"][name][k] for seed in seeds]) for k in KS]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    t = [
        welch_t(
            [seed["recall"]["mixed-50"][k] for seed in seeds],
            [seed["recall"]["random"][k] for seed in seeds],
        )
        for k in KS
    ]
    rows.append("| Welch's t, mixed-50 − random | " + " | ".join(f"{v:+.1f}" for v in t) + " |")
    return rows


def curve_rows(seeds: list[dict[str, Any]]) -> list[str]:
    """R@1 and seconds at every evaluated checkpoint, mean ± sd over the seeds."""
    points: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for seed in seeds:
        for point in seed["curve"]:
            if point["step"]:
                points[point["run"], point["step"]].append(point)
    rows = ["| run | step | seconds | R@1 | R@8 |", "|---|---:|---:|---:|---:|"]
    for (name, step), found in sorted(points.items()):
        seconds = statistics.mean(p["seconds"] for p in found)
        at = [spread([p["recall"][str(k)] for p in found]) for k in (1, 8)]
        rows.append(f"| {name} | {step} | {seconds:.0f} | {at[0]} | {at[1]} |")
    return rows


def seconds_rows(seeds: list[dict[str, Any]]) -> list[str]:
    """The demo's seconds per stage, mean and range over the seeds."""
    rows = ["| stage | mean s | min–max s |", "|---|---:|---:|"]
    for stage in sorted(seeds[0]["seconds"], key=lambda name: (name == "total", name)):
        values = [seed["seconds"][stage] for seed in seeds]
        rows.append(
            f"| {stage} | {statistics.mean(values):.0f} | {min(values):.0f}–{max(values):.0f} |"
        )
    return rows


def verdict(seeds: list[dict[str, Any]]) -> str:
    """Whether mixed-50 beats random at R@1 beyond the spread (Welch's t > 2), plainly."""
    mixed = [seed["recall"]["mixed-50"][1] for seed in seeds]
    random = [seed["recall"]["random"][1] for seed in seeds]
    t = welch_t(mixed, random)
    if t > 2:
        return f"mixed-50 beats random at R@1 beyond the seeds' spread (Welch's t {t:+.1f})."
    return (
        f"mixed-50 does **not** beat random at R@1 beyond the seeds' spread (Welch's t {t:+.1f}: "
        f"{statistics.mean(mixed):.3f} against {statistics.mean(random):.3f})."
    )


def main() -> None:
    parser = harness.arguments(__doc__, "demo_seeds", work_dir=Path("/tmp/hnce-demo-seeds"))
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        help="recipe override, e.g. training.steps=120 (repeatable; the result names them: "
        "give it its own --output and --work-dir)",
    )
    args = harness.parse(parser)
    seeds = [run_seed(Path(args.work_dir), seed, args.set) for seed in range(args.seeds)]
    recipe = "as shipped" if not args.set else "with " + ", ".join(f"`{o}`" for o in args.set)
    named = "" if not args.set else ", " + ", ".join(args.set)
    lines = [
        f"# The demo at {args.seeds} seeds: mixed-50 against random "
        f"(benchmarks/demo_seeds.py{named})",
        "",
        f"`hnce demo` with configs/demo.yaml {recipe}, seeds 0..{args.seeds - 1}, one after the "
        "other on this 2-core machine with nothing else running. The seed draws the WordNet "
        "subset (8,000 synsets) and its 400 held-out mentions as well as the data order, the "
        "negatives and the dropout. Final recall of each run by `hnce eval`'s path, mean ± sd "
        "over the seeds.",
        "",
        *recall_rows(seeds),
        "",
        verdict(seeds),
        "",
        "Recall at each evaluated checkpoint (seconds from the run's start, Ray Train and "
        "version 0 included):",
        "",
        *curve_rows(seeds),
        "",
        "Where the demo's time went:",
        "",
        *seconds_rows(seeds),
    ]
    harness.write_result(args.output, lines)


if __name__ == "__main__":
    main()
