"""The comparison's result file: how it was measured, each method's final recall and wall time,
recall during training, the product-path check, plain findings and the profiled hnce step; and
the raw figures as JSON beside it.

Example::

    write_results(args.output, counts, untrained, runs, peer, total_seconds, profile)
"""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from pathlib import Path

from benchmarks import harness
from benchmarks.peer.curves import KS, Curve, Recall, Trained


def recall_cells(recall: Recall) -> str:
    return " | ".join(f"{recall[k]:.3f}" for k in KS)


def reach(curve: Curve, other: Curve) -> str:
    """When ``curve`` first reached ``other``'s final R@1, or that it never did."""
    target = other.final[1]
    seconds = curve.seconds_to_reach(target)
    if seconds is None:
        return f"not reached (final R@1 {curve.final[1]:.3f} < {target:.3f})"
    return f"{seconds:.0f} s (R@1 ≥ {target:.3f})"


def how_measured(counts: dict[str, int], total_seconds: float) -> str:
    """The paragraph on the machine, the data, both methods' settings and the evaluation."""
    return (
        f"Measured by `benchmarks/peer_sentence_transformers.py` ({total_seconds / 60:.1f} min "
        f"for the methods not already in its work directory's state.json; "
        f"{platform.machine()}, {os.cpu_count()} cores shared with other jobs). Data: the "
        f"demo's subset (configs/demo.yaml): "
        f"{counts['eval_mentions']} held-out mentions whose lemmas training never saw, "
        f"{counts['entities']} synsets; both start from all-MiniLM-L6-v2 (mean pooling, as it "
        f"declares) and train 60 steps × 8 mentions, 8 negatives each, lr 5e-5, 6 warm-up steps. "
        f"hnce: mixed-50 on the asynchronous refresh, 1 trainer core + 1 refresh core, "
        f"`negatives.share: batch` (every mention against every candidate of its step); the "
        f"cosine row adds `model.normalize: true`, temperature 0.05 and `negatives.initial: "
        f"model` (hard negatives from step 1, as the peer's). Peer: "
        f"`mine_hard_negatives` (top 8 by cosine over the catalogue) once, then "
        f"MultipleNegativesRankingLoss (in-batch + mined negatives, cosine × 20, no-duplicates "
        f"batches) on the same 480 mentions, 2 torch threads. Evaluation: one exact path for "
        f"every model (hnce's towers embed, exact scores over the whole catalogue; the peer's "
        f"vectors L2-normalised as its Normalize module and cosine loss use them)."
    )


def final_recall_table(
    runs: Sequence[Trained], peer: Trained, untrained: dict[str, Recall]
) -> list[str]:
    """Each method's final recall, wall seconds and time to reach the other's final R@1, then
    the untrained model under either scoring."""
    rows = [
        f"| {run.curve.name} | {recall_cells(run.curve.final)} | {run.seconds['total']:.0f} | "
        f"{reach(run.curve, peer.curve)} |"
        for run in runs
    ]
    rows += [
        f"| {peer.curve.name} | {recall_cells(peer.curve.final)} | {peer.seconds['total']:.0f} | "
        f"{reach(peer.curve, runs[0].curve)}, against the first row |"
    ]
    return [
        "| method | R@1 | R@8 | R@64 | wall s | time to reach the other's final R@1 |",
        "|---|---:|---:|---:|---:|---|",
        *rows,
        f"| untrained MiniLM, mean pooling, dot product (hnce's scoring) | "
        f"{recall_cells(untrained['dot'])} | | |",
        f"| untrained MiniLM, mean pooling, cosine (the peer's scoring) | "
        f"{recall_cells(untrained['cosine'])} | | |",
    ]


def recall_during_training(runs: Sequence[Trained], peer: Trained) -> list[str]:
    """The table of every method's recall at each of its checkpoints, with its wall seconds."""
    return [
        "Recall during training (wall seconds from each method's start: hnce from the "
        "`run_training` call, Ray and DeepSpeed start-up included; the peer from loading the "
        "model, mining included):",
        "",
        "| method | step | seconds | R@1 | R@8 | R@64 |",
        "|---|---:|---:|---:|---:|---:|",
        *(
            f"| {run.curve.name} | {step} | {secs:.0f} | {recall_cells(recall)} |"
            for run in [*runs, peer]
            for secs, step, recall in run.curve.points
        ),
    ]


def product_path_check(run: Trained) -> list[str]:
    """``run``'s final recall through ``evaluate_export`` against the exact path's, with the
    blank line after it; nothing when the product path was not measured."""
    if run.product is None:
        return []
    return [
        f"Check of the evaluation path: hnce's final export through the product's "
        f"`evaluate_export` (encoder actors + FAISS flat index): {recall_cells(run.product)} "
        f"(R@1 / R@8 / R@64), against {recall_cells(run.curve.final)} by the exact "
        f"path.",
        "",
    ]


def recall_findings(runs: Sequence[Trained], peer: Trained) -> list[str]:
    """Who wins each cutoff and the wall-clock to the end of training, hnce run by hnce run."""
    lines = []
    theirs_seconds = peer.seconds["total"]
    for run in runs:
        name = run.curve.name.split(" (")[0]
        for k in KS:
            ours, theirs = run.curve.final[k], peer.curve.final[k]
            winner = name if ours > theirs else "sentence-transformers" if theirs > ours else "tie"
            lines.append(f"- R@{k}: {name} {ours:.3f} vs peer {theirs:.3f}: **{winner}**.")
        faster = name if run.seconds["total"] < theirs_seconds else "sentence-transformers"
        lines.append(
            f"- Wall-clock to the end of training: {name} {run.seconds['total']:.0f} s vs peer "
            f"{theirs_seconds:.0f} s (of which mining {peer.seconds['mine_hard_negatives']:.0f} "
            f"s): **{faster}**."
        )
    return lines


def findings(runs: Sequence[Trained], peer: Trained) -> list[str]:
    """Plain statements of who wins what, from the measured figures, and where the time went."""
    lines = recall_findings(runs, peer)
    for run in runs:
        parts = run.seconds
        lines.append(
            f"- Where {run.curve.name.split(' (')[0]}'s {parts['total']:.0f} s went: "
            f"{parts['before first step']:.0f} s before its first step (Ray, Ray Train and "
            f"DeepSpeed start-up, model load, negatives version 0), {parts['steps']:.0f} s in "
            f"its steps ({parts['per step']:.2f} s a step on 1 thread, the refresh on the other "
            f"core), {parts['rest']:.0f} s checkpoints, polls and shutdown."
        )
    theirs_seconds = peer.seconds["total"]
    mining, steps = peer.seconds["mine_hard_negatives"], peer.curve.points[-1][1]
    lines.append(
        f"- Where the peer's {theirs_seconds:.0f} s went: {mining:.0f} s loading and mining, "
        f"{(theirs_seconds - mining) / steps:.2f} s a step on 2 threads."
    )
    return lines


def step_profile(table: str, phases: dict[str, float]) -> list[str]:
    """The profiled hnce step: seconds of batch assembly vs the rest, and the operator table."""
    return [
        f"Profile of one hnce training step (torch.profiler, in-process worker loop, 1 thread as "
        f"in the run; random negatives before any refresh, same batch shape): batch assembly "
        f"(Parquet look-ups of the candidates, tokenization, negatives drawn) "
        f"{phases['batch assembly']:.2f} s, forward + backward + optimizer step "
        f"{phases['train_micro_batch']:.2f} s per step. Top operators by total CPU time:",
        "",
        "```",
        table.strip(),
        "```",
    ]


def write_raw(
    path: Path, untrained: dict[str, Recall], runs: Sequence[Trained], peer: Trained
) -> None:
    """The measured figures as JSON: untrained recall, each hnce run and the peer."""
    raw = {
        "untrained": untrained,
        "runs": {run.curve.name: run.__dict__ | {"curve": run.curve.points} for run in runs},
        "peer": peer.__dict__ | {"curve": peer.curve.points},
    }
    harness.write_json(path, raw)


def write_results(
    out: Path,
    counts: dict[str, int],
    untrained: dict[str, Recall],
    runs: Sequence[Trained],
    peer: Trained,
    total_seconds: float,
    profile: tuple[str, dict[str, float]],
) -> None:
    """The markdown result file (how it was measured, final recall, recall during training, the
    product-path check, findings, the step profile); BENCHMARKS.md rebuilt, the file printed."""
    lines = [
        "# Against the peer: sentence-transformers vs `hnce train` (WordNet demo subset)",
        "",
        how_measured(counts, total_seconds),
        "",
        *final_recall_table(runs, peer, untrained),
        "",
        *recall_during_training(runs, peer),
        "",
        *product_path_check(runs[0]),
        "Findings:",
        "",
        *findings(runs, peer),
        "",
        *step_profile(*profile),
    ]
    harness.write_result(out, lines)
