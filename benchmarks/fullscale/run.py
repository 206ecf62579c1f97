"""The full-scale run's work directory: its paths, its options, its state file (finished stages
and interrupted attempts, :class:`benchmarks.harness.StageState`), the recipe every stage after
conversion reads and the small random-weight model they train.

Example::

    run = Run(Path("/work/fullscale-run"), 5_903_530, 128, 32, 2, "auto").load()
    write_model(run)
    write_recipe(run, steps=300)

A run is of one scorer (``Run.scorer``): dual over flat shards, or sum-of-max over the
compressed token index (:data:`SCORERS`).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks import harness
from hnce.pipeline.data.kilt_synthetic import AIDA_MENTIONS, aida_file_name

#: each scorer's ``model.scorer`` and ``index`` sections. Sum-of-max indexes every entity token
#: (about 124 an entity here: 732M at 5,903,530): IVF-PQ lists with 8 one-byte codes and an
#: int64 id a token, plus its standalone code and list number (8 + 2 bytes), about 26 bytes a
#: token, 19 GB a version; two versions exist while a refresh builds, beside the 13 GB of inputs
#: and tables, on this machine's 70 GB free (16 codes: 31 GB a version, 75 GB in all, does not
#: fit). 4,096 lists: assigning a token to its list costs one core 6 µs at 4,096 lists and 24 µs
#: at 16,384 (d = 32, FAISS's flat quantiser, measured here), so a version's 732M tokens cost
#: 1.6 core-hours of adding and encoding at 4,096 and 5.5 at 16,384. Lists of about 179,000
#: tokens, 8 probed a query token: 1.4M codes scanned (about 13 ms on one core at the 110M codes/s
#: measured here), as 32 of 16,384 lists would. Trained on 40 tokens a list (163,840:
#: ``IndexSpec.train_size``; FAISS asks 39; the runs measured trained on 2^20);
#: 1,024 candidate tokens a query token per holder (ColBERT's k' of 1,000).
SCORERS: dict[str, dict[str, dict[str, Any]]] = {
    "dual": {"scorer": {"name": "dual", "m": 1}, "index": {"kind": "flat", "keep_versions": 2}},
    "som": {
        "scorer": {"name": "som", "m": 1},
        "index": {
            "kind": "ivfpq",
            "nlist": 4096,
            "nprobe": 8,
            "pq_m": 8,
            "candidate_depth": 1024,
            "keep_versions": 1,
        },
    },
}


#: refreshes over the whole catalogue that ``--steps auto`` sizes training for: two for dual;
#: one for sum-of-max, whose refresh (encode, compress 732M tokens, mine every training mention
#: over the token index) takes hours on this machine's one encoder CPU
TRAINING_REFRESHES: dict[str, int] = {"dual": 2, "som": 1}


@dataclass
class Stage:
    """What one stage measured (one record of the state file)."""

    name: str
    command: str = ""
    seconds: float = 0.0
    rates: dict[str, float] = field(default_factory=dict)
    peak_gib: dict[str, float] = field(default_factory=dict)
    disk_gib: float = 0.0
    notes: dict[str, Any] = field(default_factory=dict)
    done: bool = False
    private_gib: dict[str, float] = field(default_factory=dict)  # anonymous part of peak_gib

    @classmethod
    def measured(
        cls,
        command: harness.Command,
        name: str,
        label: str,
        seconds: float,
        rates: dict[str, float],
        disk_gib: float = 0.0,
        notes: dict[str, Any] | None = None,
    ) -> Stage:
        """The stage `command` ran: its memory figures (peak and private GiB per role) with what
        the stage measured."""
        return cls(
            name,
            label,
            seconds,
            rates,
            command.peak_gib,
            disk_gib,
            notes or {},
            private_gib=command.private_gib,
        )

    def record(self) -> dict[str, Any]:
        """The stage as the state file keeps it."""
        return asdict(self)


@dataclass
class Run:
    """The benchmark's work directory, options and state (``<workdir>/state.json``)."""

    workdir: Path
    entities: int
    entity_length: int
    hidden: int
    layers: int
    steps: str
    scorer: str = "dual"
    state: harness.StageState = field(init=False)
    raw: Path = field(init=False)  # the generated KILT-format inputs
    data: Path = field(init=False)  # the converted dataset
    run_dir: Path = field(init=False)  # hnce's run: checkpoints, index versions, event logs
    recipe: Path = field(init=False)  # the recipe every stage after conversion reads
    log: Path = field(init=False)  # the commands' stderr, appended command by command

    def __post_init__(self) -> None:
        self.raw, self.data, self.run_dir = (self.workdir / name for name in ("raw", "data", "run"))
        self.recipe, self.log = self.workdir / "recipe.yaml", self.workdir / "commands.log"
        meta = {
            "entities": self.entities,
            "entity_length": self.entity_length,
            "model": {"hidden": self.hidden, "layers": self.layers},
            "scorer": self.scorer,
        }
        self.state = harness.StageState(
            self.workdir / "state.json",
            meta,
            ("entities", "entity_length", "scorer"),
            absent={"scorer": "dual"},  # runs from before the option were dual
        )

    def load(self) -> Run:
        """The work directory created and its state read (a state of another run refused)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.state.load()
        return self

    @property
    def stages(self) -> dict[str, Stage]:
        """Every stage measured so far, by name."""
        return {name: Stage(**record) for name, record in self.state.stages.items()}

    def aida(self, split: str) -> Path:
        return self.raw / aida_file_name(split)

    def mentions(self) -> dict[str, int]:
        """AIDA's split sizes, scaled down with the catalogue below 1M entities."""
        scale = min(1.0, self.entities / 1_000_000)
        return {split: max(64, round(count * scale)) for split, count in AIDA_MENTIONS.items()}

    def last_activity(self) -> float:
        """When a command last wrote to the log or to the run's event logs (``hnce train``
        writes its steps there, not to the log): where an interrupted attempt ended."""
        return harness.last_modified([self.log, *self.run_dir.glob("*.jsonl")])


def disk_gib(*paths: Path) -> float:
    """Bytes under ``paths`` (files, not links), in GiB."""
    total = 0
    for root in paths:
        for directory, _, files in os.walk(root):
            for name in files:
                path = Path(directory) / name
                if not path.is_symlink():
                    total += path.stat().st_size
    return total / harness.GIB


def recipe_tree(run: Run, steps: int) -> dict[str, Any]:
    """The recipe of every stage after conversion (written to ``<workdir>/recipe.yaml``)."""
    return {
        "run": {"dir": str(run.run_dir), "seed": 0},
        "data": {"root": str(run.data), "train_split": "train", "eval_split": "test"},
        "model": {
            "path": str(run.workdir / "model"),
            "mention_length": 32,
            "entity_length": run.entity_length,
            "scorer": SCORERS[run.scorer]["scorer"],
        },
        "negatives": {
            "sampler": "mixed",
            "mixed": {"hard_fraction": 0.5},
            "num_negatives": 15,
            "source": "index",
        },
        "loss": {"name": "nce"},
        "training": training_section(steps),
        "refresh": {
            "enabled": True,
            "num_encoders": 1,
            "encoder_cpus": 1,
            "encoder_batch_size": 256,
            "shard_size": 25_000,
            # a shard of 25,000 entities at 128 tokens takes minutes on an idle core, and many
            # times that on a shared one: the wait before an actor counts as hung grows with it
            # (hnce.cluster.compute.refresh.plan.wait_floor_seconds: 7,500 s here)
            "top_n": 100,
        },
        "index": SCORERS[run.scorer]["index"],
        "cluster": {"address": "local"},
        "eval": {"ks": [1, 64, 100]},
    }


def training_section(steps: int) -> dict[str, Any]:
    """The recipe's training settings: one worker on one CPU, ``steps`` steps."""
    return {
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
    }


def write_recipe(run: Run, steps: int) -> None:
    """``<workdir>/recipe.yaml`` for ``steps`` training steps."""
    run.recipe.write_text(yaml.safe_dump(recipe_tree(run, steps), sort_keys=False))


def write_model(run: Run) -> None:
    """A small BERT (random weights, seed 0) with the packaged MiniLM's tokenizer."""
    from benchmarks.harness.models import write_random_bert
    from hnce.encoders.biencoder import minilm_path

    write_random_bert(run.workdir / "model", minilm_path(), run.layers, run.hidden, head_width=32)
