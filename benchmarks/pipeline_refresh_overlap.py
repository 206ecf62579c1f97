"""Trainer steps/s while a refresh runs vs the trainer alone (docs/engines.md).

One process, one local Ray instance, the same config twice: (A) refresh disabled, random
negatives; (B) mixed-50 negatives with a checkpoint every few steps, so the refresh coordinator
(its encoder actor on its own CPU) re-encodes the catalogue and mines negatives nearly all the
time. Steps/s are taken from the event log between the first checkpoint and the end (B) and
over the same step range (A). Target: ratio >= 0.9. Both read entity tokens from the catalogue's
token store (built once, before either run is timed).

By default the catalogue is a synthetic one of 300 entities; ``--data`` takes any converted
dataset (e.g. the KILT-format catalogue `benchmarks/full_scale.py` converts), over which a
refresh takes long enough to overlap every measured step.

    .venv/bin/python -m benchmarks.pipeline_refresh_overlap [--steps 40] [--model minilm]
    .venv/bin/python -m benchmarks.pipeline_refresh_overlap --data /work/fullscale-200k/data \
        --model /work/fullscale-200k/model --entity-length 128 --steps 200 --checkpoint-every 10
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
from dataclasses import dataclass
from pathlib import Path

import ray

from benchmarks import harness
from benchmarks.training_runs import steps_per_second
from hnce.cluster.compute.index_build import IndexedModel, ensure_token_store
from hnce.cluster.stores.tables_read import EntityCatalogue
from hnce.events import RunEvent
from hnce.pipeline.config import Config, load_config
from hnce.pipeline.data.synthetic import generate_synthetic_dataset
from hnce.pipeline.event_log import read_events
from hnce.pipeline.models import untrained_export
from hnce.pipeline.train.trainer import run_training
from hnce.progress import quiet

ROOT = harness.ROOT


@dataclass
class Overlap:
    """What one benchmark run measured: the catalogue, both rates and the refresh's activity."""

    data: Path
    entities: int
    first_step: int
    alone_rate: float
    overlap_rate: float
    refreshes: int
    switches: int
    seconds: float


def parse_args() -> argparse.Namespace:
    """The command line options."""
    sizes = {"steps": 40, "checkpoint_every": 5, "model": "minilm", "entity_length": 32}
    parser = harness.arguments(__doc__, "pipeline_refresh_overlap", **sizes)
    parser.add_argument("--data", type=Path, default=None, help="a converted dataset")
    return harness.parse(parser)


def training_configs(args: argparse.Namespace, data: Path, work: Path) -> tuple[Config, Config]:
    """The two runs under ``work``: (A) the trainer alone, (B) the trainer while refreshing."""
    common = [
        f"data.root={data}",
        f"model.path={args.model}",
        f"training.steps={args.steps}",
        f"training.checkpoint_every={args.checkpoint_every}",
        "training.num_workers=1",
        "training.cpus_per_worker=1",
        "training.batch_size=8",
        "training.zero_stage=0",
        "training.log_every=1",
        "training.negatives_check_every=1",
        "model.mention_length=32",
        f"model.entity_length={args.entity_length}",
        "negatives.num_negatives=4",
    ]
    recipe = ROOT / "configs/synthetic-test.yaml"
    alone = load_config(
        recipe,
        [
            *common,
            f"run.dir={work / 'alone'}",
            "negatives.sampler=random",
            "negatives.source=none",
            "refresh.enabled=false",
        ],
    )
    overlapped = load_config(
        recipe,
        [
            *common,
            f"run.dir={work / 'overlap'}",
            "refresh.encoder_cpus=1",
            # the test recipe's mixed negatives and refresh, off by default
            "negatives.sampler=mixed",
            "negatives.source=index",
            "refresh.enabled=true",
        ],
    )
    return alone, overlapped


def measure(args: argparse.Namespace) -> Overlap:
    """Train alone, then while refreshing, in a scratch directory; steps/s of both runs."""
    with tempfile.TemporaryDirectory(prefix="hnce-bench-") as scratch:
        work = Path(scratch)
        data = args.data
        if data is None:
            data = work / "data"
            generate_synthetic_dataset(data, num_worlds=3, entities_per_world=100)
        entities = len(EntityCatalogue.open(data))
        alone, overlapped = training_configs(args, data, work)
        ensure_token_store(data, IndexedModel.from_export(untrained_export(alone)))
        timer = harness.Timer()
        run_training(alone)
        summary = run_training(overlapped)
        ray.shutdown()
        first = args.checkpoint_every + 1
        return Overlap(
            data=data,
            entities=entities,
            first_step=first,
            alone_rate=steps_per_second(work / "alone", first, args.steps),
            overlap_rate=steps_per_second(work / "overlap", first, args.steps),
            refreshes=summary.refreshes,
            switches=len(read_events(work / "overlap", RunEvent.NEGATIVES)),
            seconds=timer.elapsed(),
        )


def report_lines(args: argparse.Namespace, overlap: Overlap) -> list[str]:
    """The result file's markdown lines."""
    ratio = overlap.overlap_rate / overlap.alone_rate
    return [
        "# Trainer steps/s while a refresh runs vs trainer alone",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores; model {args.model}; "
        f"catalogue {overlap.data} ({overlap.entities:,} entities, entity length "
        f"{args.entity_length}, token store); "
        f"1 trainer worker (1 CPU) + 1 encoder actor (1 CPU); steps {overlap.first_step}-"
        f"{args.steps}; checkpoint every {args.checkpoint_every} steps; measured in one run "
        f"({overlap.seconds:.0f}s).",
        "",
        "| setting | steps/s |",
        "|---|---|",
        f"| trainer alone (random negatives, no refresh) | {overlap.alone_rate:.3f} |",
        f"| trainer while refreshing (mixed-50, {overlap.refreshes} refreshes, "
        f"{overlap.switches} switches) | {overlap.overlap_rate:.3f} |",
        f"| **ratio** (target >= 0.9) | **{ratio:.2f}** |",
        *coverage_note(overlap),
    ]


def coverage_note(overlap: Overlap) -> list[str]:
    """What part of a refresh the measured steps overlapped, when none of them saw one finish."""
    if overlap.refreshes:
        return []
    return [
        "",
        "No refresh finished within the measured steps: the encoder actor was encoding the "
        "catalogue during every one of them, so mining and the switch to a new negatives "
        "version are not in this figure. `benchmarks/full_scale.py`'s train stage measures "
        "the trainer over whole refreshes.",
    ]


@quiet()  # no progress bars from hnce in this process
def main() -> None:
    args = parse_args()
    harness.write_result(args.output, report_lines(args, measure(args)))


if __name__ == "__main__":
    main()
