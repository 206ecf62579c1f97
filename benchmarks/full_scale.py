"""The whole path at KILT scale on one machine (issue 12): generate → convert → token store →
index v0 → trainer alone → `hnce train` with asynchronous refreshes → `hnce eval` → KILT
predictions, each stage one real `hnce` command in its own child process.

Per stage it records the wall time, the throughput (entities/s, queries/s, steps/s), the peak
resident memory of every process role (driver, trainer workers, coordinator, encoder actors,
Ray's own; `process_memory.PeakMemory` over this benchmark's process tree) and the disk used,
into ``<workdir>/state.json``. Running it again resumes: a stage whose output exists and
verifies is skipped, an interrupted one is run again (each command resumes its own work: the
generator part by part, `hnce train` from its newest checkpoint, index builds shard by shard),
and the wall time of a stage that was interrupted (a session that ended) is the sum of its
attempts, the gap between them excluded. ``--stop-before STAGE`` ends a session's run before a
stage it cannot hold whole.
The results go to ``benchmarks/results/full_scale.md`` (``full_scale_<N>.md`` for a smaller
``--entities N``) and BENCHMARKS.md, after every stage; a partial run is labelled as such.

The model is a small BERT with random weights and the packaged MiniLM's vocabulary (the model
size is not the point: the catalogue is). ``hnce train`` runs with one trainer worker and one
encoder actor on one CPU each; its number of steps is chosen so that at least two refreshes
over the whole catalogue land during training (``--steps auto``: 2.5 refresh durations, as
estimated from index v0's rate on one CPU, at the trainer-alone step rate; at least 300).

    .venv/bin/python benchmarks/full_scale.py --entities 200000 --workdir /work/fullscale-200k
    nohup nice -n 2 .venv/bin/python benchmarks/full_scale.py --workdir /work/fullscale-run \\
        > /work/fullscale-run/log.txt 2>&1 &
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from process_memory import PeakMemory
from report import update_benchmarks_md
from tqdm import tqdm

from hnce.cluster.stores.files import atomic_write_json
from hnce.pipeline.data.kilt_synthetic import (
    AIDA_MENTIONS,
    GENERATOR_FILE,
    KILT_PAGES,
    KNOWLEDGE_SOURCE,
    aida_file_name,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "full_scale.md"
HNCE = [
    sys.executable,
    "-c",
    "import sys; from hnce.pipeline.cli.main import main; sys.exit(main())",
]
GIB = 1 << 30
TARGETS = {"hours": 3.0, "process_gib": 8.0, "total_gib": 16.0}
CALIBRATION_STEPS = 40
MIN_REFRESHES = 2


@dataclass
class Stage:
    """What one stage measured (JSON in the state file)."""

    name: str
    command: str = ""
    seconds: float = 0.0
    rates: dict[str, float] = field(default_factory=dict)
    peak_gib: dict[str, float] = field(default_factory=dict)
    disk_gib: float = 0.0
    notes: dict[str, Any] = field(default_factory=dict)
    done: bool = False


@dataclass
class Run:
    """The benchmark's work directory, options and state file."""

    workdir: Path
    entities: int
    entity_length: int
    hidden: int
    layers: int
    steps: str
    stages: dict[str, Stage] = field(default_factory=dict)
    #: per unfinished stage: when its current attempt started, and the seconds of attempts that
    #: were interrupted (a session that ended, a killed process) before it
    attempts: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def raw(self) -> Path:
        return self.workdir / "raw"

    @property
    def data(self) -> Path:
        return self.workdir / "data"

    @property
    def run_dir(self) -> Path:
        return self.workdir / "run"

    @property
    def recipe(self) -> Path:
        return self.workdir / "recipe.yaml"

    @property
    def state_file(self) -> Path:
        return self.workdir / "state.json"

    def aida(self, split: str) -> Path:
        return self.raw / aida_file_name(split)

    def mentions(self) -> dict[str, int]:
        """AIDA's split sizes, scaled down with the catalogue below 1M entities."""
        scale = min(1.0, self.entities / 1_000_000)
        return {split: max(64, round(count * scale)) for split, count in AIDA_MENTIONS.items()}

    def save(self) -> None:
        state = {
            "entities": self.entities,
            "entity_length": self.entity_length,
            "model": {"hidden": self.hidden, "layers": self.layers},
            "stages": {name: asdict(stage) for name, stage in self.stages.items()},
            "attempts": self.attempts,
        }
        atomic_write_json(self.state_file, state)

    def load(self) -> None:
        if not self.state_file.is_file():
            return
        state = json.loads(self.state_file.read_text())
        if state["entities"] != self.entities or state["entity_length"] != self.entity_length:
            raise SystemExit(
                f"{self.state_file}: a run of {state['entities']} entities at length "
                f"{state['entity_length']}; use another --workdir"
            )
        self.stages = {name: Stage(**stage) for name, stage in state["stages"].items()}
        self.attempts = state.get("attempts", {})


def disk_gib(*paths: Path) -> float:
    """Bytes under ``paths`` (files, not links), in GiB."""
    total = 0
    for root in paths:
        for directory, _, files in os.walk(root):
            for name in files:
                path = Path(directory) / name
                if not path.is_symlink():
                    total += path.stat().st_size
    return total / GIB


def run_hnce(arguments: list[str], log: Path) -> tuple[float, dict[str, float], str]:
    """``hnce <arguments>`` in a child process under PeakMemory: (seconds, peak GiB per role,
    stdout). Its stderr (logs, progress bars) is appended to ``log``."""
    started = time.perf_counter()
    with PeakMemory() as memory, log.open("a") as errors:
        errors.write(f"\n$ hnce {' '.join(arguments)}\n")
        errors.flush()
        child = subprocess.run(
            [*HNCE, *arguments], stdout=subprocess.PIPE, stderr=errors, text=True, cwd=ROOT
        )
    if child.returncode != 0:
        raise SystemExit(
            f"hnce {' '.join(arguments)} failed with exit status {child.returncode}; see {log}"
        )
    return time.perf_counter() - started, memory.as_gib(), child.stdout


def recipe_tree(run: Run, steps: int) -> dict[str, Any]:
    """The recipe of every stage after conversion (written to ``<workdir>/recipe.yaml``)."""
    return {
        "run": {"dir": str(run.run_dir), "seed": 0},
        "data": {"root": str(run.data), "train_split": "train", "eval_split": "test"},
        "model": {
            "path": str(run.workdir / "model"),
            "mention_length": 32,
            "entity_length": run.entity_length,
            "scorer": {"name": "dual", "m": 1},
        },
        "negatives": {
            "sampler": "mixed",
            "mixed": {"hard_fraction": 0.5},
            "num_negatives": 15,
            "source": "index",
        },
        "loss": {"name": "nce"},
        "training": {
            "steps": steps,
            "batch_size": 16,
            "learning_rate": 1.0e-4,
            "warmup_steps": 20,
            "zero_stage": 0,
            "num_workers": 1,
            "cpus_per_worker": 1,
            "checkpoint_every": max(10, steps // 20),
            "negatives_check_every": 5,
            "keep_checkpoints": 2,
            "max_failures": 1,
            "log_every": 10,
        },
        "refresh": {
            "enabled": True,
            "num_encoders": 1,
            "encoder_cpus": 1,
            "batch_size": 256,
            "shard_size": 25_000,
            "top_n": 100,
            # a shard of 25,000 entities at 128 tokens takes minutes on an idle core, and many
            # times that on a shared one: the default 15 minutes before an actor counts as hung
            # is too short for the first shard here
            "wait_floor_seconds": 7200.0,
        },
        "index": {"kind": "flat", "keep_versions": 2},
        "cluster": {"address": "local"},
        "eval": {"ks": [1, 64, 100], "batch_size": 256},
    }


def write_recipe(run: Run, steps: int) -> None:
    run.recipe.write_text(yaml.safe_dump(recipe_tree(run, steps), sort_keys=False))


# Stages: each returns the Stage it measured; `verify` says whether its output is already there.


def generate(run: Run, log: Path) -> Stage:
    counts = run.mentions()
    arguments = ["data", "synthetic-kilt", "--out", str(run.raw), "--pages", str(run.entities)]
    arguments += [f"--{split}={count}" for split, count in counts.items()] + ["--workers", "2"]
    seconds, peak, _ = run_hnce(arguments, log)
    return Stage(
        "generate",
        "hnce " + " ".join(arguments[:2]),
        seconds,
        {"entities/s": run.entities / seconds},
        peak,
        disk_gib(run.raw),
    )


def generated(run: Run) -> bool:
    path = run.raw / GENERATOR_FILE
    return path.is_file() and json.loads(path.read_text())["parameters"]["pages"] == run.entities


def convert(run: Run, log: Path) -> Stage:
    aida = [str(run.aida(split)) for split in AIDA_MENTIONS]
    source = ["--knowledge-source", str(run.raw / KNOWLEDGE_SOURCE)]
    arguments = ["data", "kilt", *source, "--aida", *aida, "--out", str(run.data), "--overwrite"]
    seconds, peak, _ = run_hnce(arguments, log)
    summary = json.loads((run.data / "summary.json").read_text())
    return Stage(
        "convert",
        "hnce data kilt",
        seconds,
        {"entities/s": summary["entities"] / seconds},
        peak,
        disk_gib(run.data),
        {"summary seconds": summary.get("seconds", {}), "mentions": summary["mentions"]},
    )


def converted(run: Run) -> bool:
    from hnce.cluster.stores.tables_read import EntityCatalogue

    try:
        return len(EntityCatalogue.open(run.data)) == run.entities
    except Exception:
        return False


def write_model(run: Run) -> None:
    """A small BERT (random weights, seed 0) with the packaged MiniLM's tokenizer."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from hnce.encoders.biencoder import minilm_path

    directory = run.workdir / "model"
    if (directory / "config.json").is_file():
        return
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=run.hidden,
        num_hidden_layers=run.layers,
        num_attention_heads=max(1, run.hidden // 32),
        intermediate_size=4 * run.hidden,
        max_position_embeddings=512,
    )
    building = directory.with_name(".building-model")
    shutil.rmtree(building, ignore_errors=True)
    BertModel(config).save_pretrained(building)
    tokenizer.save_pretrained(building)
    building.replace(directory)


def token_store(run: Run, log: Path) -> Stage:
    """The catalogue tokenized once (`hnce.cluster.stores.tokens`), as the first refresh would: timed on its
    own here so that index v0's rate is the encoders' alone."""
    code = (
        "import sys; from pathlib import Path; from transformers import AutoTokenizer; "
        "from hnce.cluster.stores.tokens import TokenStore; from hnce.encoders.formatting import register_markers; "
        "t = AutoTokenizer.from_pretrained(sys.argv[2]); register_markers(t); "
        "TokenStore.ensure(Path(sys.argv[1]), t, int(sys.argv[3]))"
    )
    started = time.perf_counter()
    arguments = [str(run.data), str(run.workdir / "model"), str(run.entity_length)]
    with PeakMemory() as memory, log.open("a") as errors:
        subprocess.run(
            [sys.executable, "-c", code, *arguments], stderr=errors, check=True, cwd=ROOT
        )
    seconds = time.perf_counter() - started
    return Stage(
        "tokens",
        "TokenStore.ensure",
        seconds,
        {"entities/s": run.entities / seconds},
        memory.as_gib(),
        disk_gib(run.data / "tokens"),
    )


def tokenized(run: Run) -> bool:
    tokens = run.data / "tokens"
    return tokens.is_dir() and any(
        path.name.endswith(f"-{run.entity_length}") for path in tokens.iterdir()
    )


def index_v0(run: Run, log: Path) -> Stage:
    """Index and negatives v0 of the untrained model, two encoder actors of one CPU."""
    arguments = ["refresh", "--config", str(run.recipe), "--initial"]
    arguments += ["--set", "refresh.num_encoders=2"]
    seconds, peak, _ = run_hnce(arguments, log)
    return Stage(
        "index v0",
        "hnce refresh --initial",
        seconds,
        {"entities/s": run.entities / seconds, "entities/s per CPU": run.entities / seconds / 2},
        peak,
        disk_gib(run.run_dir / "index"),
    )


def recall_stage(name: str, run: Run, log: Path, checkpoint: str) -> Stage:
    """``hnce eval`` on the test mentions (R@1/64/100)."""
    out = run.workdir / f"eval-{checkpoint}.json"
    arguments = ["eval", "--config", str(run.recipe), "--checkpoint", checkpoint]
    arguments += ["--set", "refresh.num_encoders=2", "--out", str(out), "--no-progress"]
    seconds, peak, _ = run_hnce(arguments, log)
    report = json.loads(out.read_text())[0]
    queries = report["num_mentions"]
    return Stage(
        name,
        f"hnce eval --checkpoint {checkpoint}",
        seconds,
        {"queries/s": queries / seconds, "entities/s": run.entities / seconds},
        peak,
        disk_gib(run.run_dir),
        {"recall": report["recall"], "mentions": queries, "index": report["index"]},
    )


def events_rate(run_dir: Path, first: int, last: int) -> float:
    from hnce.pipeline.train.events import read_events

    times = {event["step"]: event["time"] for event in read_events(run_dir, "step")}
    return (last - first) / (times[last] - times[first])


def calibrate(run: Run, log: Path) -> Stage:
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
    seconds, peak, _ = run_hnce(arguments, log)
    rate = events_rate(alone, 10, CALIBRATION_STEPS)
    return Stage("trainer alone", "hnce train (no refresh)", seconds, {"steps/s": rate}, peak)


def training_steps(run: Run) -> int:
    if run.steps != "auto":
        return int(run.steps)
    per_cpu = run.stages["index v0"].rates["entities/s per CPU"]
    rate = run.stages["trainer alone"].rates["steps/s"]
    return max(300, math.ceil(2.5 * run.entities / per_cpu * rate))


def refresh_windows(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "refresh_log.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def window_rate(steps_at: list[tuple[float, int]], start: float, end: float) -> float:
    """Steps/s between the first and last logged step inside [start, end] (steps are logged
    every ``log_every``, so counting log lines would undercount)."""
    inside = [(t, step) for t, step in steps_at if start <= t <= end]
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def train(run: Run, log: Path) -> Stage:
    """`hnce train` with the asynchronous refresh (one encoder actor on its own CPU)."""
    from hnce.pipeline.train.events import read_events

    steps = training_steps(run)
    write_recipe(run, steps)
    arguments = ["train", "--config", str(run.recipe), "--no-progress"]
    seconds, peak, stdout = run_hnce(arguments, log)
    refreshes = [r for r in refresh_windows(run.run_dir) if r["outcome"] == "published"]
    steps_at = [(event["time"], event["step"]) for event in read_events(run.run_dir, "step")]
    during = [window_rate(steps_at, r["started"], r["started"] + r["seconds"]) for r in refreshes]
    alone = run.stages["trainer alone"].rates["steps/s"]
    overlap = sum(during) / len(during) if during else float("nan")
    return Stage(
        "train",
        f"hnce train ({steps} steps)",
        seconds,
        {
            "steps/s": steps / seconds,
            "steps/s during refreshes": overlap,
            "refresh entities/s": (
                run.entities / (sum(r["seconds"] for r in refreshes) / len(refreshes))
                if refreshes
                else float("nan")
            ),
        },
        peak,
        disk_gib(run.run_dir),
        {
            "steps": steps,
            "refreshes published": len(refreshes),
            "refresh seconds": [round(r["seconds"], 1) for r in refreshes],
            "overlap ratio": overlap / alone,
            "summary": [line for line in stdout.splitlines() if line.startswith("trained ")],
        },
    )


def trained(run: Run) -> bool:
    from hnce.cluster.stores.checkpoints import newest_checkpoint

    newest = newest_checkpoint(run.run_dir) if run.run_dir.is_dir() else None
    steps = run.stages.get("train")
    return newest is not None and steps is not None and newest[0] >= steps.notes["steps"]


def predictions(run: Run, log: Path) -> Stage:
    test = run.aida("test")
    arguments = ["eval", "--config", str(run.recipe), "--checkpoint", "newest"]
    arguments += ["--set", "refresh.num_encoders=2", "--no-progress"]
    arguments += ["--kilt-predictions", str(test)]
    seconds, peak, stdout = run_hnce(arguments, log)
    written = run.run_dir / "predictions" / test.name
    lines = sum(1 for _ in written.open())
    inputs = sum(1 for _ in test.open())
    if lines != inputs:
        raise SystemExit(f"{written}: {lines} predictions for {inputs} test inputs")
    return Stage(
        "predictions",
        "hnce eval --kilt-predictions",
        seconds,
        {"queries/s": inputs / seconds},
        peak,
        disk_gib(run.run_dir / "predictions"),
        {"test ids": inputs, "file": str(written), "line": stdout.strip()},
    )


STAGES: list[tuple[str, Callable[[Run, Path], Stage]]] = [
    ("generate", generate),
    ("convert", convert),
    ("tokens", token_store),
    ("index v0", index_v0),
    ("eval untrained", lambda run, log: recall_stage("eval untrained", run, log, "untrained")),
    ("trainer alone", calibrate),
    ("train", train),
    ("eval", lambda run, log: recall_stage("eval", run, log, "newest")),
    ("predictions", predictions),
]
VERIFY: dict[str, Callable[[Run], bool]] = {
    "generate": generated,
    "convert": converted,
    "tokens": tokenized,
    "train": trained,
}


def is_done(run: Run, name: str) -> bool:
    recorded = name in run.stages and run.stages[name].done
    return recorded and VERIFY.get(name, lambda _: True)(run)


def report(run: Run) -> str:
    """The markdown of ``results/full_scale.md`` from the state (partial runs labelled)."""
    stages = [run.stages[name] for name, _ in STAGES if name in run.stages]
    complete = len(stages) == len(STAGES) and all(stage.done for stage in stages)
    total = sum(stage.seconds for stage in stages)
    roles = sorted({role for stage in stages for role in stage.peak_gib if role != "all processes"})
    worst = max(
        (v for s in stages for r, v in s.peak_gib.items() if r != "all processes"), default=0
    )
    together = max((s.peak_gib.get("all processes", 0.0) for s in stages), default=0.0)
    missing = [name for name, _ in STAGES if name not in run.stages]
    status = (
        "complete"
        if complete
        else f"**PARTIAL: {len(stages)} of {len(STAGES)} stages measured; not run yet: "
        f"{', '.join(missing)}**"
    )
    lines = [
        f"# The whole path at {run.entities:,} entities on one machine",
        "",
        f"`benchmarks/full_scale.py --entities {run.entities}`: {status}. Machine: "
        f"{platform.machine()}, {os.cpu_count()} cores shared with other work, no GPU. Model: "
        f"BERT {run.layers} layers, hidden {run.hidden}, random weights, MiniLM vocabulary; "
        f"entity length {run.entity_length}, mention length 32. Each stage is one command in its "
        "own process; peak RSS per process role (GiB) over the benchmark's process tree.",
        "",
        "| stage | command | wall | throughput | " + " | ".join(roles) + " | all | disk GiB |",
        "|---|---|---:|---|" + "---:|" * (len(roles) + 2),
    ]
    for stage in stages:
        rates = ", ".join(f"{value:,.1f} {unit}" for unit, value in stage.rates.items())
        peaks = [f"{stage.peak_gib[r]:.2f}" if r in stage.peak_gib else "" for r in roles]
        lines.append(
            f"| {stage.name} | `{stage.command}` | {stage.seconds / 60:,.1f} min | {rates} | "
            + " | ".join(peaks)
            + f" | {stage.peak_gib.get('all processes', 0):.2f} | {stage.disk_gib:.2f} |"
        )
    lines += [
        "",
        f"Targets: whole run {total / 3600:.2f} h of < {TARGETS['hours']:.0f} h"
        f"{'' if complete else ' (so far)'}; largest process {worst:.2f} GiB of < "
        f"{TARGETS['process_gib']:.0f} GiB; all processes together {together:.2f} GiB of < "
        f"{TARGETS['total_gib']:.0f} GiB.",
        "",
    ]
    for stage in stages:
        if stage.notes:
            lines.append(f"- {stage.name}: " + json.dumps(stage.notes, default=str))
    return "\n".join(lines) + "\n"


def begin_attempt(run: Run, name: str, log: Path) -> None:
    """Record that ``name`` starts (again). An attempt of it that was interrupted ended when
    its command last wrote to ``log`` or to the run's event logs (``hnce train`` writes its
    steps there, not to ``log``); its seconds are kept, so the stage's wall time is the sum of
    its attempts without the gaps between them."""
    attempt = run.attempts.setdefault(name, {"started": None, "interrupted_seconds": []})
    if attempt["started"] is not None:
        written = [log, *run.run_dir.glob("*.jsonl")]
        ended = max((p.stat().st_mtime for p in written if p.is_file()), default=0.0)
        attempt["interrupted_seconds"].append(max(0.0, ended - attempt["started"]))
    attempt["started"] = time.time()
    run.save()


def end_attempt(run: Run, name: str, stage: Stage) -> None:
    """Add the interrupted attempts of ``name`` to ``stage``'s wall time, and say so."""
    interrupted = run.attempts.pop(name, {}).get("interrupted_seconds", [])
    if interrupted:
        stage.seconds += sum(interrupted)
        stage.notes["interrupted attempts (seconds each, included in the wall time)"] = [
            round(seconds, 1) for seconds in interrupted
        ]


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=KILT_PAGES)
    parser.add_argument("--workdir", type=Path, default=Path("/work/fullscale-run"))
    parser.add_argument("--entity-length", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--steps", default="auto", help="training steps, or 'auto' (docstring)")
    parser.add_argument("--output", type=Path, default=None, help="results markdown")
    parser.add_argument(
        "--report", action="store_true", help="only rewrite the results from the state file"
    )
    parser.add_argument(
        "--stop-before",
        choices=[name for name, _ in STAGES],
        help="stop when this stage is next (a session that cannot hold the next stage whole)",
    )
    return parser.parse_args()


def run_stages(run: Run, log: Path, output: Path, stop_before: str | None) -> None:
    """Each stage not yet done, in order, its results written after each one."""
    with tqdm(STAGES, desc="full scale", unit="stage") as bar:
        for name, stage_function in bar:
            bar.set_postfix_str(name)
            if is_done(run, name):
                continue
            if name == stop_before:
                break
            load_before = os.getloadavg()[1]
            begin_attempt(run, name, log)
            stage = stage_function(run, log)
            end_attempt(run, name, stage)
            # the machine is shared: its 5-minute load average says how contended a stage was
            stage.notes["load average (5 min) before/after"] = [load_before, os.getloadavg()[1]]
            stage.done = True
            run.stages[name] = stage
            run.save()
            tqdm.write(
                f"{name}: {stage.seconds / 60:.1f} min, {stage.rates}, peak {stage.peak_gib}"
            )
            write_report(run, output)


def write_report(run: Run, output: Path) -> str:
    """Write the run's results to ``output``, rebuild BENCHMARKS.md; returns the results."""
    text = report(run)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    update_benchmarks_md()
    return text


def main() -> int:
    args = parse_arguments()
    # On a loaded 2-core machine the raylet can take longer than Ray's 60 s to register.
    os.environ.setdefault("RAY_raylet_start_wait_time_s", "600")
    run = Run(
        args.workdir.resolve(),
        args.entities,
        args.entity_length,
        args.hidden,
        args.layers,
        args.steps,
    )
    run.workdir.mkdir(parents=True, exist_ok=True)
    run.load()
    log = run.workdir / "commands.log"
    output = args.output or RESULTS.with_name(
        RESULTS.name if args.entities == KILT_PAGES else f"full_scale_{args.entities}.md"
    )
    if not args.report:
        write_model(run)
        write_recipe(run, run.stages["train"].notes["steps"] if "train" in run.stages else 300)
        run_stages(run, log, output, args.stop_before)
    print(write_report(run, output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
