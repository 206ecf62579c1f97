"""The whole path at KILT scale on one machine: generate → convert → token store →
index v0 → trainer alone → `hnce train` with asynchronous refreshes → `hnce eval` → KILT
predictions, each stage one real `hnce` command in its own child process.

Per stage it records the wall time, the throughput (entities/s, queries/s, steps/s), the peak
resident memory of every process role (driver, trainer workers, coordinator, encoder actors,
Ray's own; :class:`benchmarks.harness.PeakMemory` over this benchmark's process tree) and the
disk used, into ``<workdir>/state.json``. Running it again resumes: a stage whose output exists
and verifies is skipped, an interrupted one is run again (each command resumes its own work: the
generator part by part, the token store from its recorded row, `hnce train` from its newest
checkpoint, index builds shard by shard),
and the wall time of a stage that was interrupted (a session that ended) is the sum of its
attempts, the gap between them excluded (:class:`benchmarks.harness.StageState`).
``--stop-before STAGE`` ends a session's run before a stage it cannot hold whole.
The results go to ``benchmarks/results/full_scale.md`` (``full_scale_<N>.md`` for a smaller
``--entities N``), after every stage; a partial run is labelled as such.

The model is a small BERT with random weights and the packaged MiniLM's vocabulary (the model
size is not the point: the catalogue is). ``hnce train`` runs with one trainer worker and one
encoder actor on one CPU each; its number of steps is chosen so that at least two refreshes
over the whole catalogue land during training, one for sum-of-max (``--steps auto``: 2.5 or 1.5
refresh durations, as estimated from index v0's rate on one CPU, at the trainer-alone step rate;
at least 300).
The parts: :mod:`benchmarks.fullscale` (the run, its stages, its report).

    .venv/bin/python -m benchmarks.full_scale --entities 200000 --workdir /work/fullscale-200k
    setsid nohup .venv/bin/python -m benchmarks.full_scale --nice 19 --scorer som \\
        --workdir /work/fullscale-som > /work/fullscale-som.log 2>&1 &
    setsid nohup .venv/bin/python -m benchmarks.full_scale --nice 19 \\
        --workdir /work/fullscale-run > /work/fullscale-run/log.txt 2>&1 &

(``setsid`` and ``--nice``: its session's scheduler group yields to other work,
:func:`benchmarks.harness.arguments.lower_priority`.)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tqdm import tqdm

from benchmarks import harness
from benchmarks.fullscale.report import report
from benchmarks.fullscale.run import SCORERS, Run, write_model, write_recipe
from benchmarks.fullscale.stages import STAGES, is_done
from hnce.pipeline.data.kilt_synthetic import KILT_PAGES


def result_name(args: argparse.Namespace) -> str:
    """full_scale, or full_scale_<N> for a smaller catalogue; ``_som`` appended for sum-of-max."""
    name = "full_scale" if args.entities == KILT_PAGES else f"full_scale_{args.entities}"
    return name if args.scorer == "dual" else f"{name}_{args.scorer}"


def parse_arguments() -> argparse.Namespace:
    parser = harness.arguments(
        __doc__,
        result_name,
        work_dir=Path("/work/fullscale-run"),
        entities=KILT_PAGES,
        entity_length=128,
        hidden=32,
        layers=2,
    )
    parser.add_argument("--steps", default="auto", help="training steps, or 'auto' (docstring)")
    parser.add_argument(
        "--scorer",
        choices=sorted(SCORERS),
        default="dual",
        help="dual over flat shards, or sum-of-max over the compressed token index "
        "(benchmarks.fullscale.run.SCORERS); a work directory holds one scorer's run",
    )
    parser.add_argument(
        "--report", action="store_true", help="only rewrite the results from the state file"
    )
    parser.add_argument(
        "--stop-before",
        choices=[name for name, _ in STAGES],
        help="stop when this stage is next (a session that cannot hold the next stage whole)",
    )
    return harness.parse(parser)


def run_stages(run: Run, output: Path, stop_before: str | None) -> None:
    """Each stage not yet done, in order, its results written after each one."""

    def written(name: str, record: dict) -> None:
        tqdm.write(f"{name}: {record['rates']}, peak {record['peak_gib']}")
        harness.write_text(output, report(run))

    stages = [(name, lambda m=measure: m(run).record()) for name, measure in STAGES]
    harness.run_stages(
        run.state,
        stages,
        lambda name: is_done(run, name),
        stop_before,
        written,
        run.last_activity,
    )


def main() -> int:
    args = parse_arguments()
    # On a loaded 2-core machine the raylet can take longer than Ray's 60 s to register.
    os.environ.setdefault("RAY_raylet_start_wait_time_s", "600")
    run = Run(
        args.work_dir.resolve(),
        args.entities,
        args.entity_length,
        args.hidden,
        args.layers,
        args.steps,
        args.scorer,
    ).load()
    if not args.report:
        write_model(run)
        stages = run.stages
        write_recipe(run, stages["train"].notes["steps"] if "train" in stages else 300)
        run_stages(run, args.output, args.stop_before)
    harness.write_text(args.output, report(run), echo=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
