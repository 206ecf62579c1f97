"""The comparison's result file: how it was measured, each method's final recall and wall time
over the seeds (mean ± sd, Welch's t), when hnce reached the peer's final R@1, recall during
training seed by seed (also as a plot), where each method's seconds went, the product-path
check; and the raw figures as JSON beside it.

Example::

    write_results(args.output, counts, untrained, seeds, total_seconds, args.set)
"""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Sequence
from pathlib import Path

from benchmarks import harness
from benchmarks.peer.curves import KS, Curve, Recall, SeedRuns, Trained
from benchmarks.wordnet_comparison import spread, welch_t

PEER = "sentence-transformers (mined once, MNRL)"


def recall_cells(recall: Recall) -> str:
    return " | ".join(f"{recall[k]:.3f}" for k in KS)


def listed(overrides: Sequence[str], quote: str = "`") -> str:
    """``overrides`` as a suffix to a label: ", `a`, `b`" (nothing without any)."""
    return "".join(f", {quote}{override}{quote}" for override in overrides)


def hnce_recipe(overrides: Sequence[str]) -> str:
    """What hnce trained with: the demo recipe as shipped, or with ``--set`` overrides."""
    shipped = (
        "mixed-50 on the asynchronous refresh, negatives version 0 mined with the starting model, "
        "`negatives.share: batch`, `training.cores: auto`: the trainer on both cores while no "
        "refresh works"
    )
    if not overrides:
        return f"configs/demo.yaml as shipped ({shipped})"
    return f"configs/demo.yaml ({shipped}) with {listed(overrides)[2:]}"


def how_measured(
    counts: dict[str, int], seeds: int, total_seconds: float, overrides: Sequence[str]
) -> str:
    """The paragraph on the machine, the data, both methods' settings and the evaluation."""
    return (
        f"Measured by `benchmarks/peer_sentence_transformers.py` ({total_seconds / 60:.1f} min "
        f"for the runs not already in its work directory's state files; "
        f"{platform.machine()}, {os.cpu_count()} cores, nothing else running). Data: the demo's "
        f"subset (configs/demo.yaml): {counts['seen_eval_mentions']} held-out mentions of synsets "
        f"training saw and {counts['unseen_eval_mentions']} of synsets it never saw, "
        f"{counts['entities']} synsets; both start from all-MiniLM-L6-v2 "
        f"(mean pooling, as it declares) and train 60 steps × 8 mentions, 8 negatives each, "
        f"lr 5e-5, 6 warm-up steps, cosine scores at temperature 0.05 (the peer's scale 20). "
        f"hnce: {hnce_recipe(overrides)}. Peer: `mine_hard_negatives` "
        f"(top 8 by cosine over the catalogue) once, then MultipleNegativesRankingLoss (in-batch "
        f"+ mined negatives, no-duplicates batches) on the same 480 mentions as hnce's run of "
        f"the same seed, 2 torch threads. Seeds 0..{seeds - 1}: hnce's `run.seed` (data order, "
        f"negative draws, dropout) and the peer trainer's seed. Evaluation: one exact path for "
        f"every model (hnce's towers embed, exact scores over the whole catalogue; the peer's "
        f"vectors L2-normalised as its Normalize module and cosine loss use them)."
    )


def final_recall_table(
    seeds: Sequence[SeedRuns], untrained: dict[str, Recall], overrides: Sequence[str]
) -> list[str]:
    """Each method's final recall and wall seconds, mean ± sd over the seeds, then the untrained
    model under either scoring; hnce's row names the ``--set`` overrides it ran with."""
    hnce_name = seeds[0].hnce.curve.name + listed(overrides)

    def row(name: str, runs: list[Trained]) -> str:
        cells = " | ".join(spread([run.curve.final[k] for run in runs]) for k in KS)
        seconds = [run.seconds["total"] for run in runs]
        return f"| {name} | {cells} | {statistics.mean(seconds):.0f} ± {statistics.stdev(seconds):.0f} |"

    return [
        "| method | R@1 | R@8 | R@64 | wall s |",
        "|---|---:|---:|---:|---:|",
        row(hnce_name, [s.hnce for s in seeds]),
        row(PEER, [s.peer for s in seeds]),
        f"| untrained MiniLM, mean pooling, dot product | {recall_cells(untrained['dot'])} | |",
        f"| untrained MiniLM, mean pooling, cosine | {recall_cells(untrained['cosine'])} | |",
    ]


def reach(curve: Curve, target: float) -> str:
    """When ``curve`` first reached R@1 ``target`` at one of its checkpoints, or that it did not."""
    seconds = curve.seconds_to_reach(target)
    return "not by its last checkpoint" if seconds is None else f"{seconds:.0f} s"


def reach_table(seeds: Sequence[SeedRuns]) -> list[str]:
    """Seed by seed: the peer's final R@1 and wall seconds, and when hnce reached that R@1."""
    return [
        "| seed | peer's final R@1 | peer's wall s | hnce reached it at (its checkpoints) |",
        "|---:|---:|---:|---|",
        *(
            f"| {s.seed} | {s.peer.curve.final[1]:.3f} | {s.peer.seconds['total']:.0f} | "
            f"{reach(s.hnce.curve, s.peer.curve.final[1])} |"
            for s in seeds
        ),
    ]


def recall_during_training(seeds: Sequence[SeedRuns]) -> list[str]:
    """Every method's recall at each of its checkpoints, seed by seed, with its wall seconds."""
    return [
        "Recall during training (wall seconds from each method's start: hnce from the "
        "`run_training` call, Ray and DeepSpeed start-up and version 0 included; the peer from "
        "loading the model, mining included):",
        "",
        "| seed | method | step | seconds | R@1 | R@8 | R@64 |",
        "|---:|---|---:|---:|---:|---:|---:|",
        *(
            f"| {s.seed} | {name} | {step} | {secs:.0f} | {recall_cells(recall)} |"
            for s in seeds
            for name, run in (("hnce", s.hnce), ("peer", s.peer))
            for secs, step, recall in run.curve.points
        ),
    ]


def recall_plot(path: Path, seeds: Sequence[SeedRuns], overrides: Sequence[str]) -> None:
    """R@1 against wall seconds, one line per method and seed, the untrained start left out; the
    title names hnce's ``--set`` overrides."""
    with harness.plot(path, figsize=(6.5, 4)) as (_, axis):
        for s in seeds:
            for run, colour, name in ((s.hnce, "tab:blue", "hnce"), (s.peer, "tab:orange", "peer")):
                points = run.curve.points
                axis.plot(
                    [secs for secs, _, _ in points],
                    [recall[1] for _, _, recall in points],
                    marker="o",
                    color=colour,
                    alpha=0.8,
                    label=name if s.seed == 0 else None,
                )
        axis.set_xlabel("wall seconds from the method's start")
        axis.set_ylabel("held-out R@1")
        recipe = "demo recipe" + listed(overrides, quote="")
        axis.set_title(f"hnce ({recipe}) vs sentence-transformers, one line per seed", wrap=True)
        axis.legend()


def findings(seeds: Sequence[SeedRuns]) -> list[str]:
    """Who wins each cutoff by more than the seeds' spread, the wall-clock, and where each
    method's seconds went (means over the seeds)."""
    hnce, peer = [s.hnce for s in seeds], [s.peer for s in seeds]
    lines = []
    for k in KS:
        ours = [run.curve.final[k] for run in hnce]
        theirs = [run.curve.final[k] for run in peer]
        t = welch_t(ours, theirs)
        verdict = (
            "**hnce, beyond the spread**"
            if t > 2
            else "**sentence-transformers, beyond the spread**"
            if t < -2
            else "within the spread"
        )
        lines.append(
            f"- R@{k}: hnce {spread(ours)} vs peer {spread(theirs)}, Welch's t {t:.1f}: {verdict}."
        )

    def mean(runs: list[Trained], part: str) -> float:
        return statistics.mean(run.seconds[part] for run in runs)

    lines.append(
        f"- Wall-clock to the end of training: hnce {mean(hnce, 'total'):.0f} s vs peer "
        f"{mean(peer, 'total'):.0f} s (means)."
    )
    lines.append(
        f"- Where hnce's {mean(hnce, 'total'):.0f} s went: {mean(hnce, 'before first step'):.0f} s "
        f"before its first step (Ray, Ray Train and DeepSpeed start-up, model load, negatives "
        f"version 0 mined with the starting model), {mean(hnce, 'steps'):.0f} s in its steps "
        f"({mean(hnce, 'per step'):.2f} s a step, on 1 or 2 threads as the refresh works), "
        f"{mean(hnce, 'rest'):.0f} s checkpoints, polls and shutdown."
    )
    mining = mean(peer, "mine_hard_negatives")
    steps = peer[0].curve.points[-1][1]
    lines.append(
        f"- Where the peer's {mean(peer, 'total'):.0f} s went: {mining:.0f} s loading and "
        f"mining, {(mean(peer, 'total') - mining) / steps:.2f} s a step on 2 threads."
    )
    return lines


def product_path_check(run: Trained) -> list[str]:
    """``run``'s final recall through ``evaluate_export`` against the exact path's, with the
    blank line after it; nothing when the product path was not measured."""
    if run.product is None:
        return []
    return [
        f"Check of the evaluation path: seed 0's final hnce export through the product's "
        f"`evaluate_export` (encoder actors + FAISS flat index): {recall_cells(run.product)} "
        f"(R@1 / R@8 / R@64), against {recall_cells(run.curve.final)} by the exact path.",
        "",
    ]


def write_raw(path: Path, untrained: dict[str, Recall], seeds: Sequence[SeedRuns]) -> None:
    """The measured figures as JSON: untrained recall, then each seed's two runs."""
    raw = {
        "untrained": untrained,
        "seeds": {
            s.seed: {
                name: run.__dict__ | {"curve": run.curve.points}
                for name, run in (("hnce", s.hnce), ("peer", s.peer))
            }
            for s in seeds
        },
    }
    harness.write_json(path, raw)


def write_results(
    out: Path,
    counts: dict[str, int],
    untrained: dict[str, Recall],
    seeds: Sequence[SeedRuns],
    total_seconds: float,
    overrides: Sequence[str],
) -> None:
    """The markdown result file and its plot; the file printed.
    ``overrides``: the ``--set`` options hnce's recipe ran with (none: as shipped)."""
    plot_path = out.with_suffix(".png")
    recall_plot(plot_path, seeds, overrides)
    lines = [
        "# Against the peer: sentence-transformers vs `hnce train` (WordNet demo subset"
        + listed(overrides, quote="")
        + ")",
        "",
        how_measured(counts, len(seeds), total_seconds, overrides),
        "",
        *final_recall_table(seeds, untrained, overrides),
        "",
        "When hnce's run first reached the peer's final R@1 (the same seed's):",
        "",
        *reach_table(seeds),
        "",
        "Findings:",
        "",
        *findings(seeds),
        "",
        *product_path_check(seeds[0].hnce),
        *recall_during_training(seeds),
        "",
        f"![held-out R@1 against wall seconds, each seed]({plot_path.name})",
    ]
    harness.write_result(out, lines)
