"""The paper's comparison (§6.5, Table 1; Appendix A) on real WordNet, through ``hnce train``, with error bars.

Scorers dual, multi-8, som and poly-16 (docs/math.md), each trained with random, hard (eq. 8) and
mixed-50 negatives under the hard-negative NCE loss (eq. 5/11) at an equal budget (same steps,
mentions per step and negatives per mention), plus the trainer's other samplers for dual; every
cell with ``--seeds`` seeds (the seed draws the data order, the negatives and the dropout). Each
run is a real ``hnce train`` (DeepSpeed under Ray Train; the samplers that mine start from
negatives version 0 mined with the starting model, ``negatives.initial: model``, then follow the
asynchronous refresh of a checkpoint every ``steps / 6`` steps) and each evaluation a real ``hnce eval`` through the cluster:
recall@1/@8/@64 of held-out mentions whose lemmas never occur in training (the WordNet
converter's lemma-disjoint split), against the demo-style catalogue (every gold, every other sense
of the golds' lemmas, random synsets).

Reported: mean ± sample standard deviation over the seeds, and which differences exceed the
spread (Welch's t statistic > 2 between a cell and the same scorer's random cell). A cell the
recipe refuses (e.g. a sampler the trainer lacks on this branch) is reported as refused with the
reason. Runs resume: each finished run is kept in ``<work-dir>/state.json``.

    .venv/bin/python -m benchmarks.wordnet_comparison    # 1.5-4 min per run on 2 shared cores

writes ``benchmarks/results/wordnet_comparison.md`` and ``.png``.
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

from tqdm import tqdm

from benchmarks import harness, wordnet_runs
from hnce.pipeline.config import ConfigError
from hnce.progress import quiet

SCORERS = {
    "dual": "{name: dual, m: 1}",
    "multi-8": "{name: multi, m: 8}",
    "som": "{name: som, m: 1}",
    "poly-16": "{name: poly, m: 16}",
}
NO_INDEX = [  # samplers that mine nothing
    "negatives.source=none",
    "refresh.enabled=false",
    "negatives.cache.enabled=false",
]
FROM_MODEL = "negatives.initial=model"  # version 0 mined with the starting model
NEGATIVES = {
    "random": ["negatives.sampler=random", *NO_INDEX],
    "hard": ["negatives.sampler=hard", FROM_MODEL],
    "mixed-50": ["negatives.sampler=mixed", "negatives.mixed.hard_fraction=0.5", FROM_MODEL],
}
DUAL_ONLY = {
    "lexical": ["negatives.sampler=lexical", *NO_INDEX],
    "momentum-queue": ["negatives.sampler=momentum-queue", *NO_INDEX],
    "adversarial": ["negatives.sampler=adversarial", FROM_MODEL],
    "ohem": ["negatives.sampler=ohem", FROM_MODEL],
    "mixed-50 shared": ["negatives.sampler=mixed", "negatives.share=batch", FROM_MODEL],
}
KS = (1, 8, 64)
PAPER_CLAIM = {"better": "agrees with the paper", "worse": "contradicts the paper"}


def cells() -> list[tuple[str, str, list[str]]]:
    """(scorer, negatives, overrides) of every cell of the table."""
    table = [
        (scorer, negatives, [f"model.scorer={spec}", *overrides])
        for scorer, spec in SCORERS.items()
        for negatives, overrides in NEGATIVES.items()
    ]
    table += [
        ("dual", negatives, [f"model.scorer={SCORERS['dual']}", *overrides])
        for negatives, overrides in DUAL_ONLY.items()
    ]
    return table


def equal_budget(steps: int) -> list[str]:
    """The recipe overrides every cell shares: ``steps`` steps of 8 mentions × 4 negatives at
    24 tokens, a checkpoint (so an asynchronous refresh) every ``steps / 6`` steps, dot-product
    scores, no sharing and random version 0 unless a cell says otherwise (pinned here, so the
    cells mean the same whatever configs/demo.yaml's defaults become)."""
    return [
        "model.normalize=false",
        "loss.temperature=null",
        "negatives.share=none",
        "negatives.initial=random",
        f"training.steps={steps}",
        "training.batch_size=8",
        "training.learning_rate=1.0e-4",
        "training.warmup_steps=3",
        f"training.checkpoint_every={max(1, steps // 6)}",
        "training.negatives_check_every=2",
        "negatives.num_negatives=4",
        "model.mention_length=24",
        "model.entity_length=24",
        "refresh.top_n=16",
    ]


def welch_t(a: list[float], b: list[float]) -> float:
    """Welch's t statistic of the difference of two means; when both spreads are 0, ±inf if the
    means differ and 0 if they are equal (three seeds at the same ceiling are no difference)."""
    se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
    difference = statistics.mean(a) - statistics.mean(b)
    if se > 0:
        return difference / se
    return math.copysign(math.inf, difference) if difference else 0.0


def spread(values: list[float]) -> str:
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


Results = dict[tuple[str, str], list[wordnet_runs.RunResult]]
Refused = dict[tuple[str, str], str]


def run_cells(args: argparse.Namespace, data: Path) -> tuple[Results, Refused]:
    """Every run of the cells asked for, seed-major (finished ones read back from the state
    file): the results by cell, and the cells the recipe refused with the reason."""
    state = harness.StageState(args.work_dir / "state.json").load()
    budget = equal_budget(args.steps)
    results: Results = {}
    refused: Refused = {}
    table = [cell for cell in cells() if args.only is None or f"{cell[0]}/{cell[1]}" in args.only]
    runs = [(cell, seed) for seed in range(args.seeds) for cell in table]  # seed-major
    for (scorer, negatives, overrides), seed in tqdm(runs, desc="runs", unit="run"):
        name = f"{scorer}-{negatives}".replace(" ", "-")
        run_dir = args.work_dir / "runs" / f"{name}-s{seed}"
        try:
            config = wordnet_runs.recipe(run_dir, data, *budget, *overrides, f"run.seed={seed}")
        except ConfigError as error:
            refused[(scorer, negatives)] = str(error).splitlines()[-1]
            continue
        if args.report_only and not state.done(wordnet_runs.run_key(name, seed)):
            continue
        result = wordnet_runs.train_and_evaluate(name, seed, config, state)
        results.setdefault((scorer, negatives), []).append(result)
        tqdm.write(f"{name} seed {seed}: R@1 {result.recall[1]:.3f} ({result.seconds:.0f} s)")
    return results, refused


@quiet()  # no progress bars from hnce in this process
def main() -> None:
    parser = wordnet_runs.wordnet_arguments(
        __doc__, "wordnet_comparison", Path("runs/wordnet-comparison"), 1000, steps=30, seeds=3
    )
    parser.add_argument("--only", nargs="*", default=None, help="cells 'scorer/negatives' to run")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="write the report from the runs already finished under --work-dir, train nothing",
    )
    args = harness.parse(parser)
    timer = harness.Timer()
    data = wordnet_runs.prepare_dataset(
        args.work_dir, args.entities, args.train_mentions, args.test_mentions
    )
    results, refused = run_cells(args, data)
    write_report(args, results, refused, timer.elapsed())


def table_rows(results: Results, refused: Refused) -> list[str]:
    """One row per cell (bold: beyond the spread of its random cell), then the refused cells."""
    lines = []
    for (scorer, negatives), runs in results.items():
        baseline = results.get((scorer, "random"))
        figures = []
        for k in KS:
            values = [r.recall[k] for r in runs]
            text = spread(values) if len(values) > 1 else f"{values[0]:.3f}"
            comparable = baseline and negatives != "random" and min(len(values), len(baseline)) > 1
            if comparable and abs(welch_t(values, [r.recall[k] for r in baseline])) > 2:
                text = f"**{text}**"
            figures.append(text)
        mean_seconds = statistics.mean(r.seconds for r in runs)
        refreshes = statistics.mean(r.refreshes for r in runs)
        lines.append(
            f"| {scorer} | {negatives} | {len(runs)} | {' | '.join(figures)} | "
            f"{mean_seconds:.0f} | {refreshes:.1f} |"
        )
    for (scorer, negatives), reason in refused.items():
        lines.append(f"| {scorer} | {negatives} | | refused: {reason} | | | | |")
    return lines


def write_report(
    args: argparse.Namespace, results: Results, refused: Refused, seconds: float
) -> None:
    """The result file (setting, table, plot, findings) and its plot beside it."""
    png = args.output.with_suffix(".png")
    how_measured = (
        f"Held-out mentions whose lemmas never occur in training ({args.test_mentions}), linked "
        f"against a catalogue of {args.entities} synsets (every gold, the other senses of the "
        f"golds' lemmas, random synsets); {args.train_mentions} train mentions. Every run is "
        f"`hnce train` (DeepSpeed under Ray Train, 1 worker; hard, mixed and the index samplers "
        f"start from negatives version 0 mined with the starting model, then follow the "
        f"asynchronous refresh of a checkpoint every {max(1, args.steps // 6)} steps; poly-16 is "
        f"mined exactly) "
        f"on configs/demo.yaml with the packaged all-MiniLM-L6-v2 (its declared pooling), "
        f"{args.steps} steps × 8 mentions × 4 negatives, 24 tokens; every evaluation `hnce eval` "
        f"through the cluster. Mean ± standard deviation over the seeds finished of "
        f"0..{args.seeds - 1} (column 'seeds'); "
        f"**bold**: differs from the same scorer's random cell by Welch's t > 2. Refreshes: "
        f"asynchronous refreshes published during a run (version 0 not counted). "
        f"Command: `.venv/bin/python -m benchmarks.wordnet_comparison`: "
        f"{sum(r.seconds for runs in results.values() for r in runs) / 60:.0f} min of training "
        f"runs in all on 2 cores shared with other jobs ({seconds / 60:.0f} min in this "
        f"invocation; finished runs are kept and not run again)."
    )
    plot(results, png)
    lines = [
        f"# WordNet: scorers × negatives through `hnce train`, {args.seeds} seeds "
        "(paper §6.5, Table 1; Appendix A)",
        "",
        how_measured,
        "",
        "| scorer | negatives | seeds | R@1 | R@8 | R@64 | seconds per run | refreshes per run |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
        *table_rows(results, refused),
        "",
        f"![recall@1 per cell]({png.name})",
        "",
        "Each cell against its scorer's random cell; for hard and mixed negatives, against the "
        "paper's claim that they beat random ones at equal budget:",
        "",
        *findings(results),
    ]
    harness.write_result(args.output, lines)


def findings(results: Results) -> list[str]:
    """Each cell against its scorer's random cell at R@1 and R@64, by Welch's t: better or
    worse than random beyond the spread (|t| > 2), or within it."""
    lines = []
    for (scorer, negatives), runs in results.items():
        baseline = results.get((scorer, "random"))
        if negatives == "random" or not baseline or min(len(runs), len(baseline)) < 2:
            continue
        verdicts = []
        for k in (1, 64):
            t = welch_t([r.recall[k] for r in runs], [r.recall[k] for r in baseline])
            verdict = "better" if t > 2 else "worse" if t < -2 else "within the spread"
            verdicts.append(f"R@{k} {verdict} (t = {t:+.1f})")
        at_1 = verdicts[0].split()[1]  # better, worse or within (the spread)
        paper = PAPER_CLAIM.get(at_1, "neither confirms nor contradicts the paper")
        claim = f": at R@1 {paper}" if negatives.startswith(("hard", "mixed")) else ""
        lines.append(f"- {scorer}, {negatives} vs random: {'; '.join(verdicts)}{claim}.")
    return lines


def plot(results: Results, path: Path) -> None:
    """Recall@1 per cell, mean with a ±1 standard deviation bar and every seed as a dot."""
    names = [f"{s} {n}" for s, n in results]
    with harness.plot(path, figsize=(max(6, len(names) * 0.7), 4)) as (_, axis):
        for i, runs in enumerate(results.values()):
            values = [r.recall[1] for r in runs]
            deviation = statistics.stdev(values) if len(values) > 1 else 0.0
            axis.bar(i, statistics.mean(values), yerr=deviation, color="#8fb3d9", capsize=3)
            axis.scatter([i] * len(values), values, color="black", s=8, zorder=3)
        axis.set_xticks(range(len(names)), names, fontsize=7, rotation=35, ha="right")
        axis.set_ylabel("recall@1 (held-out lemmas)")
        axis.set_title("WordNet through hnce train: mean ± sd over seeds")


if __name__ == "__main__":
    main()
