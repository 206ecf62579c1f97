"""Which negatives recipe is the default: shared negatives with random, mined, controlled and scheduled hard negatives, 3 seeds.

The comparison that decides ``configs/``'s default (the README, "False-negative control"): every
cell is ``hnce train`` (DeepSpeed under Ray Train, in-batch sharing ``negatives.share: batch``)
at the equal budget of ``benchmarks.wordnet_comparison`` on the same WordNet subset, with
``--seeds`` seeds (the seed draws the data order, the negatives and the dropout):

- ``random + shared``: the baseline, no index;
- ``mixed-50 + shared``: half the negatives drawn from the newest index version (eq. 8), version
  0 mined with the starting model, then the asynchronous refresh of a checkpoint every
  ``steps / 6`` steps;
- the same with one false-negative control (sentence-transformers' relative margin below the
  gold's score; an ANCE-style rank window ``[lo, hi)``) or with a schedule (the hard share
  rising from 0 to 0.5 over the first half of the run);
- the same, mined once: version 0 and never refreshed (``refresh.enabled: false``);
- random and mixed-50, both shared, scored as the peer scores (``cosine``: ``model.normalize``
  and temperature 0.05, MultipleNegativesRankingLoss's scale 20);
- sum-of-max with random and with hard negatives, both shared (som gained most from hard
  negatives in ``benchmarks.wordnet_comparison``);
- the peer: sentence-transformers' ``mine_hard_negatives`` once and MultipleNegativesRankingLoss on
  the very mentions the baseline trained on, same steps, batch, learning rate and negatives.

Final recall is ``hnce eval``'s (through the cluster); the curves (recall against wall-clock at
every ``--curve-every``-th checkpoint) come from the exact path of ``benchmarks.peer`` for the refreshed, the
mined-once and the baseline dual runs and the peer. A cell is reported by Welch's t against its
family's random + shared cell (``som: ``, ``cosine: ``; that cell against the dot-product one); a
recipe can be the default when it is not worse at any of R@1, R@8, R@64 (t > -2) and better at
R@1 beyond the spread (t > 2). Runs resume from ``--work-dir``.

    .venv/bin/python -m benchmarks.default_recipe --nice 10    # 2-4 min per run on 2 cores

writes ``benchmarks/results/default_recipe.md`` and two plots beside it. The long budget, where
several refreshes land and are trained on, in the demo's scoring (every dual cell cosine):

    .venv/bin/python -m benchmarks.default_recipe --steps 90 --scoring cosine --curve-every 2 \
        --work-dir runs/default-recipe-long --output benchmarks/results/default_recipe_long.md
"""

from __future__ import annotations

import argparse
import shutil
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmarks import harness
from benchmarks.peer.evaluation import HeldOut, dual_encoder, exact_recall, held_out_set
from benchmarks.peer.hnce_training import Setup
from benchmarks.peer.peer_training import peer_run, require_bench_extra
from benchmarks.training_runs import checkpoint_export
from benchmarks.wordnet_comparison import KS, SCORERS, equal_budget, plot, spread, welch_t
from benchmarks.wordnet_runs import (
    drop_run_state,
    prepare_dataset,
    recipe,
    run_key,
    wordnet_arguments,
)
from hnce.encoders.biencoder import load_biencoder, minilm_path
from hnce.events import RunEvent
from hnce.pipeline.config import Config
from hnce.pipeline.evaluate import evaluate_export
from hnce.pipeline.event_log import read_events
from hnce.pipeline.train.trainer import run_training
from hnce.progress import quiet

SHARED = "negatives.share=batch"
NO_INDEX = [
    "negatives.sampler=random",
    "negatives.source=none",
    "refresh.enabled=false",
    "negatives.cache.enabled=false",
]
MIXED = ["negatives.sampler=mixed", "negatives.mixed.hard_fraction=0.5", "negatives.initial=model"]
# The peer's scoring given to hnce: cosine at the peer's temperature (MNRL's scale 20).
COSINE = ["model.normalize=true", "loss.options={temperature: 0.05}"]
BASELINE = "random + shared"
PEER = "sentence-transformers (mined once, MNRL)"


def recipes(steps: int, scoring: str) -> dict[str, tuple[str, list[str]]]:
    """Each cell's scorer and overrides, the baseline first. ``scoring`` ``both``: the dual cells
    with dot-product scores, then the ``cosine:`` family; ``cosine``: every dual cell scored as
    ``configs/demo.yaml`` scores (cosine at temperature 0.05), no family prefix. Sum-of-max keeps
    dot-product scores (a sum of up to 24 cosines at temperature 0.05 saturates the softmax)."""
    scored = COSINE if scoring == "cosine" else []
    dual = {
        BASELINE: [*NO_INDEX, SHARED],
        "mixed-50 + shared": [*MIXED, SHARED],
        "mixed-50 + shared + margin 5%": [
            *MIXED,
            SHARED,
            "negatives.candidates.relative_margin=0.05",
        ],
        "mixed-50 + shared + rank window [2, 16)": [
            *MIXED,
            SHARED,
            "negatives.candidates.rank_window=[2, 16]",
        ],
        "mixed-50 + shared + schedule 0 → 0.5": [
            *MIXED,
            SHARED,
            f"negatives.schedule.hard_fraction=[[0, 0.0], [{steps // 2}, 0.5]]",
        ],
        "mixed-50 + shared, mined once": [*MIXED, SHARED, "refresh.enabled=false"],
    }
    cells = {name: ("dual", [*overrides, *scored]) for name, overrides in dual.items()}
    if scoring == "both":
        cells["cosine: random + shared"] = ("dual", [*NO_INDEX, SHARED, *COSINE])
        cells["cosine: mixed-50 + shared"] = ("dual", [*MIXED, SHARED, *COSINE])
    cells["som: random + shared"] = ("som", [*NO_INDEX, SHARED])
    cells["som: hard + shared"] = (
        "som",
        ["negatives.sampler=hard", "negatives.initial=model", SHARED],
    )
    return cells


CURVES = (BASELINE, "mixed-50 + shared", "mixed-50 + shared, mined once")


@dataclass
class Run:
    """One finished run: final recall, wall seconds, refreshes published and index versions the
    trainer switched to (version 0 not counted), its curve (wall seconds, step, R@k) and, for
    the baseline, the mention ids it trained on (the peer trains on them)."""

    recall: dict[int, float]
    seconds: float
    published: int = 0
    used: int = 0
    points: list[tuple[float, int, dict[int, float]]] = field(default_factory=list)
    trained: list[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Run:
        def keyed(recall: dict) -> dict[int, float]:
            return {int(k): v for k, v in recall.items()}

        points = [(s, step, keyed(r)) for s, step, r in raw["points"]]
        return cls(**{**raw, "recall": keyed(raw["recall"]), "points": points})


def hnce_run(name: str, config: Config, held_out: HeldOut, curve_every: int) -> dict[str, Any]:
    """Train ``config`` from scratch and evaluate it: the final export by ``hnce eval``, every
    ``curve_every``-th checkpoint by the exact path when ``name`` is a curve cell."""
    run_dir = config.run_dir
    shutil.rmtree(run_dir, ignore_errors=True)  # an interrupted run starts over
    timer = harness.Timer()
    summary = run_training(config)
    seconds = timer.stop()
    final = evaluate_export(config, checkpoint_export(run_dir), name).recall
    points = []
    if name in CURVES:
        every = curve_every * config.training.checkpoint_every
        for event in read_events(run_dir, RunEvent.CHECKPOINT):
            if event["step"] % every == 0:
                model = load_biencoder(checkpoint_export(run_dir, event["step"]))
                recall = exact_recall(model, held_out, normalise=False)
                points.append((event["time"] - timer.epoch, event["step"], recall))
    used = [e for e in read_events(run_dir, RunEvent.NEGATIVES) if e["version"] > 0]
    trained = [m for e in read_events(run_dir, RunEvent.STEP) for m in e["mentions"]]
    drop_run_state(run_dir)
    run = Run({k: final[k] for k in KS}, seconds, summary.refreshes, len(used), points)
    run.trained = trained if name == BASELINE else []
    return asdict(run)


def peer(args: argparse.Namespace, baseline: Config, trained: list[str], held: HeldOut) -> Run:
    """The peer on the baseline's mentions and budget (its own state file per seed)."""
    work = args.work_dir / "peer" / f"s{baseline.run.seed}"
    state = harness.StageState(work / "state.json").load()
    every = args.curve_every * baseline.training.checkpoint_every
    checkpoints = list(range(every, baseline.training.steps + 1, every))
    setup = Setup(work, state, [], baseline, checkpoints, held)
    done = peer_run(setup, trained, dual_encoder(minilm_path(), baseline))
    return Run(done.curve.final, done.seconds["total"], points=done.curve.points)


Results = dict[str, list[Run]]


def run_all(args: argparse.Namespace, data: Path) -> Results:
    """Every run, finished ones read back from the state file: the dual cells and the peer
    seed-major, then the sum-of-max cells over their ``--som-seeds`` seeds (last, so that a
    budget that runs short cuts som's seeds, not the default's comparison)."""
    state = harness.StageState(args.work_dir / "state.json").load()
    cells = recipes(args.steps, args.scoring)
    results: Results = {}
    held_out = None
    dual = {name: cell for name, cell in cells.items() if cell[0] != "som"}
    som = {name: cell for name, cell in cells.items() if cell[0] == "som"}
    for family, seeds in ((dual, args.seeds), (som, args.som_seeds)):
        for seed in tqdm(range(seeds), desc="seeds", unit="seed"):
            for name, (scorer, overrides) in family.items():
                slug = "".join(c if c.isalnum() else "-" for c in name)
                config = recipe(
                    args.work_dir / "runs" / f"{slug}-s{seed}",
                    data,
                    *equal_budget(args.steps),
                    "training.keep_checkpoints=7",
                    "training.log_every=1",  # every step's mention ids (the peer trains on them)
                    f"model.scorer={SCORERS[scorer]}",
                    *overrides,
                    f"run.seed={seed}",
                )
                held_out = held_out or held_out_set(config)
                raw = state.once(
                    run_key(slug, seed),
                    lambda n=name, c=config, h=held_out: hnce_run(n, c, h, args.curve_every),
                )
                results.setdefault(name, []).append(Run.from_json(raw))
                if name == BASELINE:
                    baseline = config
                tqdm.write(f"{name} seed {seed}: R@1 {results[name][-1].recall[1]:.3f}")
            if family is dual:
                trained = results[BASELINE][-1].trained
                results.setdefault(PEER, []).append(peer(args, baseline, trained, held_out))
    return results


def comparable(runs: list[Run], baseline: list[Run]) -> bool:
    """Whether both cells have the two seeds or more that a spread needs."""
    return min(len(runs), len(baseline)) > 1


def against(runs: list[Run], baseline: list[Run]) -> dict[int, float]:
    """Welch's t of each R@k of ``runs`` against ``baseline``."""
    return {k: welch_t([r.recall[k] for r in runs], [r.recall[k] for r in baseline]) for k in KS}


def baseline_of(name: str) -> str | None:
    """The cell ``name`` is compared with: its family's random + shared cell (families are the
    name's prefix before ': ', e.g. ``som`` or ``cosine``; dot-product dual has none), and for
    that cell the dot-product baseline; None for the baseline itself."""
    family = name.split(": ")[0] if ": " in name else None
    own = f"{family}: {BASELINE}" if family else BASELINE
    if name == BASELINE:
        return None
    return BASELINE if name == own else own


def table(results: Results) -> list[str]:
    lines = [
        "| recipe | seeds | R@1 | R@8 | R@64 | seconds per run | refreshes published | "
        "index versions used |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, runs in results.items():
        baseline = results.get(baseline_of(name) or "")
        t = against(runs, baseline) if baseline and comparable(runs, baseline) else {}
        cells = [
            f"**{spread([r.recall[k] for r in runs])}**"
            if abs(t.get(k, 0)) > 2
            else spread([r.recall[k] for r in runs])
            if len(runs) > 1
            else f"{runs[0].recall[k]:.3f}"
            for k in KS
        ]
        mined = name != PEER and "random" not in name
        refreshes = (
            f"{statistics.mean(r.published for r in runs):.1f} | "
            f"{statistics.mean(r.used for r in runs):.1f}"
            if mined
            else "| "
        )
        seconds = statistics.mean(r.seconds for r in runs)
        lines.append(
            f"| {name} | {len(runs)} | {' | '.join(cells)} | {seconds:.0f} | {refreshes} |"
        )
    return lines


def verdicts(results: Results) -> tuple[list[str], list[str]]:
    """One line per cell against its baseline, and the recipes that qualify as the default."""
    lines, qualified = [], []
    for name, runs in results.items():
        compared = baseline_of(name)
        if compared not in results:
            continue
        if not comparable(runs, results[compared]):
            lines.append(f"- {name}: {len(runs)} seed, not compared with {compared}.")
            continue
        t = against(runs, results[compared])
        worse = [k for k in KS if t[k] < -2]
        wins = t[1] > 2 and not worse
        if wins:
            qualified.append(name)
        said = ", ".join(f"R@{k} t = {t[k]:+.1f}" for k in KS)
        outcome = (
            "qualifies"
            if wins
            else f"worse at R@{', R@'.join(map(str, worse))}"
            if worse
            else "not better at R@1 beyond the spread"
        )
        lines.append(f"- {name} vs {compared}: {said}: {outcome}.")
    return lines, qualified


def plot_curves(results: Results, png: Path) -> None:
    """Recall@1 and @64 against wall-clock, every seed of each curve cell and the peer."""
    names = [name for name in (*CURVES, PEER) if name in results]
    with harness.plot(png, ncols=2, figsize=(11, 4)) as (figure, axes):
        for colour, name in enumerate(names):
            for seed, run in enumerate(results[name]):
                seconds = [s for s, _, _ in run.points]
                for axis, k in zip(axes, (1, 64), strict=True):
                    axis.plot(
                        seconds,
                        [r[k] for _, _, r in run.points],
                        marker="o",
                        color=f"C{colour}",
                        alpha=0.8,
                        label=name if seed == 0 else None,
                    )
        for axis, k in zip(axes, (1, 64), strict=True):
            axis.set_xlabel("wall-clock seconds since the run began (start-up included)")
            axis.set_ylabel(f"recall@{k} (held-out lemmas)")
        axes[0].legend(fontsize=7)
        figure.suptitle("Refreshed vs mined-once negatives vs the peer (WordNet, every seed)")


def write_report(args: argparse.Namespace, results: Results) -> None:
    bars, curves = (
        args.output.with_suffix(".png"),
        args.output.with_name(args.output.stem + "_curves.png"),
    )
    plot({("", name): runs for name, runs in results.items()}, bars)
    plot_curves(results, curves)
    lines, qualified = verdicts(results)
    minutes = sum(r.seconds for runs in results.values() for r in runs) / 60
    harness.write_result(
        args.output,
        [
            f"# Which negatives recipe is the default (issue 27): WordNet, {args.seeds} seeds"
            + (f", {args.steps} steps, cosine scores" if args.scoring == "cosine" else ""),
            "",
            f"{args.entities} synsets, {args.train_mentions} train and {args.test_mentions} "
            f"held-out mentions (lemmas never seen in training); the equal budget of the scorers "
            f"× negatives table ({args.steps} steps × 8 mentions × 4 negatives, a checkpoint "
            f"and an asynchronous refresh every {max(1, args.steps // 6)} steps), every hnce run "
            f"with `negatives.share: batch`"
            + (
                " and the demo's cosine scores (temperature 0.05) in every dual cell"
                if args.scoring == "cosine"
                else ""
            )
            + f"; the peer on the baseline's mentions at the same budget; curves every "
            f"{args.curve_every * max(1, args.steps // 6)} steps. Mean ± sd over seeds "
            f"0..{args.seeds - 1} (som: 0..{args.som_seeds - 1}); **bold**: Welch's |t| > 2 "
            f"against the family's random + shared cell (a family's random cell: against the "
            f"first one). "
            f"{minutes:.0f} min of training on 2 cores. Command: `.venv/bin/python -m "
            f"benchmarks.default_recipe --steps {args.steps} --scoring {args.scoring} "
            f"--curve-every {args.curve_every} --som-seeds {args.som_seeds} "
            f"--output {args.output}`.",
            "",
            *table(results),
            "",
            f"![recall@1 per recipe]({bars.name})",
            "",
            f"![recall against wall-clock]({curves.name})",
            "",
            *lines,
            "",
            "Recipes that qualify as the default (not worse than random + shared at any cutoff, "
            "better at R@1 beyond the spread): "
            + (", ".join(qualified) if qualified else "**none**")
            + ".",
        ],
    )


@quiet()  # no progress bars from hnce in this process
def main() -> None:
    parser = wordnet_arguments(
        __doc__,
        "default_recipe",
        Path("runs/default-recipe"),
        1000,
        steps=30,
        seeds=3,
        som_seeds=3,
        curve_every=3,
    )
    parser.add_argument(
        "--scoring",
        choices=("both", "cosine"),
        default="both",
        help="both: dot-product dual cells and a cosine family; cosine: every dual cell scored "
        "as configs/demo.yaml scores (default: %(default)s)",
    )
    args = harness.parse(parser)
    require_bench_extra()
    data = prepare_dataset(args.work_dir, args.entities, args.train_mentions, args.test_mentions)
    write_report(args, run_all(args, data))


if __name__ == "__main__":
    main()
