"""Where the time from ``hnce train`` to its first training step goes, on the demo's data.

The demo's WordNet subset and recipe (all-MiniLM-L6-v2, two trainer workers' worth of CPUs on
this machine), trained for 2 steps as a child process, twice: negatives version 0 random (the
demo's ``negatives.initial``) and mined with the starting model (``negatives.initial: model``,
which encodes the catalogue before the first step). The stages come from the run's event log:
the driver's ``launch`` event (Ray start, refresh coordinator) and rank 0's ``start`` event
(process group, model, engine, data); what lies between them is Ray Train starting its controller
and worker processes (their imports included). Negatives version 0 is prepared beside that
start-up (``initial_negatives``: its own seconds, not on the path to the first step), and the
first step waits for what is left of it (``initial_negatives_wait``). Runs of older code, which
prepared version 0 before starting Ray Train, have it as the driver stage "initial negatives".

Each invocation measures the code as it is and keeps its rows under ``--label`` in
``<output>.json``, so a change is measured before and after it in one table.

    python -m benchmarks.first_step --label before
    python -m benchmarks.first_step --label after

writes ``benchmarks/results/first_step.md``.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from benchmarks import harness
from hnce.cluster.stores.run_events import read_events
from hnce.events import RunEvent
from hnce.pipeline.config import load_config
from hnce.pipeline.demo import demo_dataset
from hnce.progress import quiet

RECIPE = harness.ROOT / "configs" / "demo.yaml"
INITIAL = ("random", "model")


def stages(run_dir: Path, launched: float) -> dict[str, float]:
    """Seconds of each stage from launching ``hnce train`` (``launched``) to its first step."""
    launch = read_events(run_dir, RunEvent.LAUNCH)[0]
    start = read_events(run_dir, RunEvent.START)[0]
    first = read_events(run_dir, RunEvent.STEP)[0]
    driver = sum(launch["seconds"].values())
    workers = sum(start["setup_seconds"].values())
    waited = sum(
        event["seconds"] for event in read_events(run_dir, RunEvent.INITIAL_NEGATIVES_WAIT)
    )
    beside = read_events(run_dir, RunEvent.INITIAL_NEGATIVES)
    return {
        "interpreter, imports, recipe": launch["time"] - driver - launched,
        **{f"driver: {name}": seconds for name, seconds in launch["seconds"].items()},
        "Ray Train controller and workers (their imports)": start["time"]
        - workers
        - launch["time"],
        **{f"worker: {name}": seconds for name, seconds in start["setup_seconds"].items()},
        "worker: waiting for negatives version 0": waited,
        "first step": first["time"] - start["time"] - waited,
        "total to the first step": first["time"] - launched,
        **({"(beside the start-up: negatives version 0)": beside[0]["seconds"]} if beside else {}),
    }


def measure(work: Path, data_root: Path, initial: str) -> dict[str, float]:
    """One 2-step ``hnce train`` of the demo recipe with ``negatives.initial: initial``."""
    run_dir = work / f"run-{initial}"
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides = {
        "run.dir": run_dir,
        "data.root": data_root,
        "negatives.initial": initial,
        "training.steps": 2,
        "training.checkpoint_every": 2,
    }
    launched = time.time()
    command = harness.run_recipe("train", RECIPE, overrides, log=work / "commands.log")
    rows = stages(run_dir, launched)
    rows["whole command (2 steps, exit included)"] = command.seconds
    shutil.rmtree(run_dir)
    return rows


def cell(seconds: float | None) -> str:
    """A stage's seconds, blank where the column's code had no such stage."""
    return "" if seconds is None else f"{seconds:.1f}"


@quiet()
def main() -> None:
    parser = harness.arguments(__doc__, "first_step", work_dir=None)
    parser.add_argument("--label", default="now", help="column of this invocation's figures")
    args = harness.parse(parser)
    work = Path(args.work_dir)
    config = load_config(RECIPE, [f"run.dir={work}"])
    config, _ = demo_dataset(config)
    state_path = args.output.with_suffix(".json")
    state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    state[args.label] = {
        initial: measure(work, Path(config.data.root), initial) for initial in INITIAL
    }
    harness.write_json(state_path, state)
    labels = list(state)
    names = list(
        dict.fromkeys(
            name for label in labels for initial in INITIAL for name in state[label][initial]
        )
    )
    last = [name for name in names if name.startswith("total") or name.startswith("whole")]
    names = [name for name in names if name not in last] + last
    header = " | ".join(f"{label}: v0 {initial}" for label in labels for initial in INITIAL)
    lines = [
        "# From `hnce train` to its first step (benchmarks/first_step.py)",
        "",
        "The demo recipe (configs/demo.yaml: WordNet subset of 8,000 synsets, all-MiniLM-L6-v2) "
        "for 2 steps, on this 2-core machine; seconds per stage from the run's event log, one "
        "run per column. Columns are labelled invocations (code before and after a change); "
        "a stage in parentheses ran beside the others, off the path to the first step.",
        "",
        f"| stage | {header} |",
        "|---|" + "---:|" * (len(labels) * len(INITIAL)),
        *(
            f"| {name} | "
            + " | ".join(
                cell(state[label][initial].get(name)) for label in labels for initial in INITIAL
            )
            + " |"
            for name in names
        ),
    ]
    harness.write_result(args.output, lines)


if __name__ == "__main__":
    main()
