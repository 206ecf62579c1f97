"""The full-scale run's result file, written from its state: one row per stage (command, wall
time, throughput, peak GiB per process role, disk), the targets, and each stage's notes. A run
not yet complete is labelled partial, with the stages not run yet.

Example::

    text = report(run)      # markdown of results/full_scale.md
"""

from __future__ import annotations

import json
import os
import platform

from benchmarks.fullscale.run import Run, Stage
from benchmarks.fullscale.stages import STAGES

TARGETS = {"hours": 3.0, "process_gib": 8.0, "total_gib": 16.0}
ALL = "all processes"


def status_line(run: Run, stages: list[Stage]) -> str:
    """complete, or PARTIAL with the stages not run yet."""
    if len(stages) == len(STAGES) and all(stage.done for stage in stages):
        return "complete"
    missing = [name for name, _ in STAGES if name not in run.state.stages]
    return (
        f"**PARTIAL: {len(stages)} of {len(STAGES)} stages measured; not run yet: "
        f"{', '.join(missing)}**"
    )


def stage_table(stages: list[Stage], roles: list[str]) -> list[str]:
    """The table of stages: command, wall minutes, throughput, peak GiB per role, disk GiB."""
    lines = [
        "| stage | command | wall | throughput | " + " | ".join(roles) + " | all | disk GiB |",
        "|---|---|---:|---|" + "---:|" * (len(roles) + 2),
    ]
    for stage in stages:
        rates = ", ".join(f"{value:,.1f} {unit}" for unit, value in stage.rates.items())
        peaks = [f"{stage.peak_gib[r]:.2f}" if r in stage.peak_gib else "" for r in roles]
        lines.append(
            f"| {stage.name} | `{stage.command}` | {stage.seconds / 60:,.1f} min | {rates} | "
            + " | ".join(peaks)
            + f" | {stage.peak_gib.get(ALL, 0):.2f} | {stage.disk_gib:.2f} |"
        )
    return lines


#: a role's peak that exceeds its private part by this much (GiB) is reported as mapped files
MAPPED_GIB = 0.5


def mapped_line(stages: list[Stage]) -> str | None:
    """Where a role's peak is largely files it maps (FAISS's memory-mapped index lists and
    codes: page cache, shared and evictable), its private (anonymous) part; None where none
    is."""
    parts = [
        f"{stage.name}: {role} {peak:.2f} GiB, {stage.private_gib[role]:.2f} GiB of it private"
        for stage in stages
        for role, peak in stage.peak_gib.items()
        if role in stage.private_gib and peak - stage.private_gib[role] >= MAPPED_GIB
    ]
    if not parts:
        return None
    return (
        "Peaks that are mostly mapped index files (page cache the kernel counts in a process's "
        "resident set once a search touches it, shared and evicted under pressure), with the "
        "largest private (anonymous) memory sampled: " + "; ".join(parts) + "."
    )


def targets_line(stages: list[Stage], complete: bool) -> str:
    """The run against its targets: hours, the largest process (and its largest private
    memory where mapped files make up much of it), all processes together."""
    total = sum(stage.seconds for stage in stages)
    worst = max((v for s in stages for r, v in s.peak_gib.items() if r != ALL), default=0)
    private = max((v for s in stages for v in s.private_gib.values()), default=0)
    together = max((s.peak_gib.get(ALL, 0.0) for s in stages), default=0.0)
    own = (
        f" (private memory at most {private:.2f} GiB)"
        if private and worst - private >= MAPPED_GIB
        else ""
    )
    return (
        f"Targets: whole run {total / 3600:.2f} h of < {TARGETS['hours']:.0f} h"
        f"{'' if complete else ' (so far)'}; largest process {worst:.2f} GiB{own} of < "
        f"{TARGETS['process_gib']:.0f} GiB; all processes together {together:.2f} GiB of < "
        f"{TARGETS['total_gib']:.0f} GiB."
    )


def report(run: Run) -> str:
    """The markdown of ``results/full_scale.md`` from the state (partial runs labelled)."""
    recorded = run.stages
    stages = [recorded[name] for name, _ in STAGES if name in recorded]
    status = status_line(run, stages)
    roles = sorted({role for stage in stages for role in stage.peak_gib if role != ALL})
    scorer = "" if run.scorer == "dual" else ", sum-of-max over the compressed token index"
    option = "" if run.scorer == "dual" else f" --scorer {run.scorer}"
    lines = [
        f"# The whole path at {run.entities:,} entities on one machine{scorer}",
        "",
        f"`python -m benchmarks.full_scale --entities {run.entities}{option}`: {status}. Machine: "
        f"{platform.machine()}, {os.cpu_count()} cores shared with other work, no GPU. Model: "
        f"BERT {run.layers} layers, hidden {run.hidden}, random weights, MiniLM vocabulary; "
        f"entity length {run.entity_length}, mention length 32. Each stage is one command in its "
        "own process; peak RSS per process role (GiB) over the benchmark's process tree.",
        "",
        *stage_table(stages, roles),
        "",
        targets_line(stages, status == "complete"),
        "",
    ]
    mapped = mapped_line(stages)
    if mapped is not None:
        lines += [mapped, ""]
    lines += [
        f"- {stage.name}: " + json.dumps(stage.notes, default=str)
        for stage in stages
        if stage.notes
    ]
    return "\n".join(lines) + "\n"
