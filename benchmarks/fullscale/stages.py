"""The stages of the full-scale run, in order, each one real ``hnce`` command in its own child
process (:func:`benchmarks.harness.run_hnce`): what it ran, its wall time, throughput, peak
memory per process role and disk, as a :class:`~benchmarks.fullscale.run.Stage`. A stage whose
output can be checked has a verifier (:data:`VERIFY`): a recorded stage whose output is gone is
run again.

Example::

    for name, measure in STAGES:
        if not is_done(run, name):
            stage = measure(run)
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from typing import Any

from benchmarks import harness
from benchmarks.fullscale.run import TRAINING_REFRESHES, Run, Stage, disk_gib, write_recipe
from benchmarks.training_runs import published_refreshes, steps_per_second, window_rate
from hnce.cluster.stores.index_store import IndexStore
from hnce.events import RunEvent
from hnce.pipeline.data.kilt_synthetic import AIDA_MENTIONS, GENERATOR_FILE, KNOWLEDGE_SOURCE

CALIBRATION_STEPS = 40


def generate(run: Run) -> Stage:
    """KILT-format inputs of ``run.entities`` pages with AIDA-sized mention files."""
    counts = run.mentions()
    arguments = ["data", "synthetic-kilt", "--out", str(run.raw), "--pages", str(run.entities)]
    arguments += [f"--{split}={count}" for split, count in counts.items()] + ["--workers", "2"]
    command = harness.run_hnce(arguments, run.log)
    return Stage.measured(
        command,
        "generate",
        "hnce " + " ".join(arguments[:2]),
        command.seconds,
        {"entities/s": run.entities / command.seconds},
        disk_gib(run.raw),
    )


def generated(run: Run) -> bool:
    path = run.raw / GENERATOR_FILE
    return path.is_file() and json.loads(path.read_text())["parameters"]["pages"] == run.entities


def convert(run: Run) -> Stage:
    """``hnce data kilt``: the generated inputs converted to hnce's tables."""
    aida = [str(run.aida(split)) for split in AIDA_MENTIONS]
    source = ["--knowledge-source", str(run.raw / KNOWLEDGE_SOURCE)]
    arguments = ["data", "kilt", *source, "--aida", *aida, "--out", str(run.data), "--overwrite"]
    command = harness.run_hnce(arguments, run.log)
    summary = json.loads((run.data / "summary.json").read_text())
    return Stage.measured(
        command,
        "convert",
        "hnce data kilt",
        command.seconds,
        {"entities/s": summary["entities"] / command.seconds},
        disk_gib(run.data),
        {"summary seconds": summary.get("seconds", {}), "mentions": summary["mentions"]},
    )


def converted(run: Run) -> bool:
    from hnce.cluster.stores.tables_read import EntityCatalogue

    try:
        return len(EntityCatalogue.open(run.data)) == run.entities
    except Exception:
        return False


TOKENS_CODE = (
    "import sys; from pathlib import Path; from transformers import AutoTokenizer; "
    "from hnce.cluster.stores.tokens import TokenStore; from hnce.encoders.formatting import register_markers; "
    "t = AutoTokenizer.from_pretrained(sys.argv[2]); register_markers(t); "
    "TokenStore.ensure(Path(sys.argv[1]), t, int(sys.argv[3]))"
)


def token_store(run: Run) -> Stage:
    """The catalogue tokenized once (`hnce.cluster.stores.tokens`), as the first refresh would:
    timed on its own here so that index v0's rate is the encoders' alone."""
    arguments = [str(run.data), str(run.workdir / "model"), str(run.entity_length)]
    command = harness.run_command(
        [sys.executable, "-c", TOKENS_CODE, *arguments], "TokenStore.ensure", run.log
    )
    return Stage.measured(
        command,
        "tokens",
        "TokenStore.ensure",
        command.seconds,
        {"entities/s": run.entities / command.seconds},
        disk_gib(run.data / "tokens"),
    )


def tokenized(run: Run) -> bool:
    tokens = run.data / "tokens"
    return tokens.is_dir() and any(
        path.name.endswith(f"-{run.entity_length}") for path in tokens.iterdir()
    )


def index_v0(run: Run) -> Stage:
    """Index and negatives v0 of the untrained model, two encoder actors of one CPU."""
    arguments = ["refresh", "--config", str(run.recipe), "--initial"]
    arguments += ["--set", "refresh.num_encoders=2"]
    command = harness.run_hnce(arguments, run.log)
    seconds = command.seconds
    index = disk_gib(run.run_dir / "index")
    vectors = IndexStore(run.run_dir / "index").current().num_vectors
    return Stage.measured(
        command,
        "index v0",
        "hnce refresh --initial",
        seconds,
        {"entities/s": run.entities / seconds, "entities/s per CPU": run.entities / seconds / 2},
        index,
        {"index vectors": vectors, "bytes per vector": round(index * harness.GIB / vectors, 1)},
    )


def recall_stage(name: str, checkpoint: str) -> Callable[[Run], Stage]:
    """The stage ``name``: ``hnce eval`` of ``checkpoint`` on the test mentions (R@1/64/100)."""

    def evaluate(run: Run) -> Stage:
        out = run.workdir / f"eval-{checkpoint}.json"
        arguments = ["eval", "--config", str(run.recipe), "--checkpoint", checkpoint]
        arguments += ["--set", "refresh.num_encoders=2", "--out", str(out), "--no-progress"]
        command = harness.run_hnce(arguments, run.log)
        report = json.loads(out.read_text())[0]
        queries, seconds = report["num_mentions"], command.seconds
        return Stage.measured(
            command,
            name,
            f"hnce eval --checkpoint {checkpoint}",
            seconds,
            {"queries/s": queries / seconds, "entities/s": run.entities / seconds},
            disk_gib(run.run_dir),
            {"recall": report["recall"], "mentions": queries, "index": report["index"]},
        )

    return evaluate


def calibrate(run: Run) -> Stage:
    """The trainer alone (random negatives, no refresh): its step rate sizes `hnce train` and is
    the baseline of the refresh-overlap ratio."""
    alone = run.workdir / "run-alone"
    arguments = ["train", "--config", str(run.recipe), "--no-progress"]
    for override in (
        f"run.dir={alone}",
        f"training.steps={CALIBRATION_STEPS}",
        f"training.checkpoint_every={CALIBRATION_STEPS}",
        "training.log_every=1",
        "negatives.sampler=random",
        "negatives.source=none",
        "refresh.enabled=false",
    ):
        arguments += ["--set", override]
    command = harness.run_hnce(arguments, run.log)
    rate = steps_per_second(alone, 10, CALIBRATION_STEPS)
    return Stage.measured(
        command,
        "trainer alone",
        "hnce train (no refresh)",
        command.seconds,
        {"steps/s": rate},
    )


def training_steps(run: Run) -> int:
    """``--steps``, or with ``auto`` the scorer's refreshes (:data:`TRAINING_REFRESHES`) plus
    half of one, in refresh durations (index v0's rate per CPU), at the trainer-alone step rate;
    at least 300."""
    if run.steps != "auto":
        return int(run.steps)
    stages = run.stages
    per_cpu = stages["index v0"].rates["entities/s per CPU"]
    rate = stages["trainer alone"].rates["steps/s"]
    refreshes = TRAINING_REFRESHES[run.scorer] + 0.5
    return max(300, math.ceil(refreshes * run.entities / per_cpu * rate))


def train(run: Run) -> Stage:
    """`hnce train` with the asynchronous refresh (one encoder actor on its own CPU)."""
    from hnce.cluster.stores.run_events import read_events

    steps = training_steps(run)
    write_recipe(run, steps)
    arguments = ["train", "--config", str(run.recipe), "--no-progress"]
    command = harness.run_hnce(arguments, run.log, keep_stdout=True)
    refreshes = published_refreshes(run.run_dir)
    steps_at = [(event["time"], event["step"]) for event in read_events(run.run_dir, RunEvent.STEP)]
    windows = [window_rate(steps_at, r["started"], r["started"] + r["seconds"]) for r in refreshes]
    during = [rate for rate in windows if not math.isnan(rate)]  # windows with a measurable rate
    alone = run.stages["trainer alone"].rates["steps/s"]
    overlap = sum(during) / len(during) if during else float("nan")
    mean_refresh = sum(r["seconds"] for r in refreshes) / len(refreshes) if refreshes else math.nan
    return Stage.measured(
        command,
        "train",
        f"hnce train ({steps} steps)",
        command.seconds,
        {
            "steps/s": steps / command.seconds,
            "steps/s during refreshes": overlap,
            "refresh entities/s": run.entities / mean_refresh if refreshes else float("nan"),
        },
        disk_gib(run.run_dir),
        train_notes(steps, refreshes, overlap / alone, command.stdout),
    )


def train_notes(steps: int, refreshes: list[dict[str, Any]], ratio: float, stdout: str) -> dict:
    """The train stage's notes: steps, the refreshes published and the overlap ratio."""
    return {
        "steps": steps,
        "refreshes published": len(refreshes),
        "refresh seconds": [round(r["seconds"], 1) for r in refreshes],
        "overlap ratio": ratio,
        "summary": [line for line in stdout.splitlines() if line.startswith("trained ")],
    }


def trained(run: Run) -> bool:
    from hnce.cluster.stores.checkpoints import newest_checkpoint

    newest = newest_checkpoint(run.run_dir) if run.run_dir.is_dir() else None
    steps = run.stages.get("train")
    return newest is not None and steps is not None and newest[0] >= steps.notes["steps"]


def predictions(run: Run) -> Stage:
    """``hnce eval --kilt-predictions`` on AIDA's test file: one prediction per input."""
    test = run.aida("test")
    arguments = ["eval", "--config", str(run.recipe), "--checkpoint", "newest"]
    arguments += ["--set", "refresh.num_encoders=2", "--no-progress"]
    arguments += ["--kilt-predictions", str(test)]
    command = harness.run_hnce(arguments, run.log, keep_stdout=True)
    written = run.run_dir / "predictions" / test.name
    lines = sum(1 for _ in written.open())
    inputs = sum(1 for _ in test.open())
    if lines != inputs:
        raise SystemExit(f"{written}: {lines} predictions for {inputs} test inputs")
    return Stage.measured(
        command,
        "predictions",
        "hnce eval --kilt-predictions",
        command.seconds,
        {"queries/s": inputs / command.seconds},
        disk_gib(run.run_dir / "predictions"),
        {"test ids": inputs, "file": str(written), "line": command.stdout.strip()},
    )


STAGES: list[tuple[str, Callable[[Run], Stage]]] = [
    ("generate", generate),
    ("convert", convert),
    ("tokens", token_store),
    ("index v0", index_v0),
    ("eval untrained", recall_stage("eval untrained", "untrained")),
    ("trainer alone", calibrate),
    ("train", train),
    ("eval", recall_stage("eval", "newest")),
    ("predictions", predictions),
]
VERIFY: dict[str, Callable[[Run], bool]] = {
    "generate": generated,
    "convert": converted,
    "tokens": tokenized,
    "train": trained,
}


def is_done(run: Run, name: str) -> bool:
    """Whether stage ``name`` is recorded as done and its output (where checked) is there."""
    return run.state.done(name) and VERIFY.get(name, lambda _: True)(run)
