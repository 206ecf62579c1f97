"""``hnce demo``'s recall against wall-clock: which checkpoints it evaluates (``demo.curve_every``,
refused with the key's file and line when a run would not write or keep them), each one's wall
seconds from its run's event log, and the table and plot it prints and saves. The whole demo runs
from a clean clone (`bash scripts/demo.sh`), not in the suite: it takes minutes."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from hnce.cluster.compute.recall import RecallReport
from hnce.cluster.stores.checkpoints import COMPLETE, EXPORT_DIR, checkpoint_dir
from hnce.cluster.stores.run_events import read_events
from hnce.events import RunEvent
from hnce.pipeline.config import ConfigError, load_config
from hnce.pipeline.demo import (
    CurvePoint,
    DemoResult,
    curve_steps,
    curve_table,
    demo_recipe,
    demo_verdict,
    plot_curve,
    training_curve,
)
from hnce.pipeline.event_log import EventLog

DEMO = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"


def test_the_demo_evaluates_every_curve_every_steps_and_refuses_checkpoints_it_would_not_have(
    tmp_path: Path,
) -> None:
    assert curve_steps(load_config(DEMO)) == [40, 80]
    assert curve_steps(load_config(DEMO, ["demo.curve_every=0"])) == []
    every_20 = ["training.checkpoint_every=20", "training.keep_checkpoints=6"]
    assert curve_steps(load_config(DEMO, [*every_20, "demo.curve_every=20"])) == [
        20,
        40,
        60,
        80,
        100,
    ]
    with pytest.raises(ConfigError, match=r"--set demo.curve_every=20: .*must be a multiple of"):
        curve_steps(load_config(DEMO, ["demo.curve_every=20"]))
    recipe = tmp_path / "short-memory.yaml"
    lines = DEMO.read_text().splitlines()
    line = next(i for i, text in enumerate(lines) if "curve_every:" in text)
    lines[line] = "  curve_every: 40"
    recipe.write_text("\n".join(lines) + "\n")
    with pytest.raises(
        ConfigError, match=rf"short-memory\.yaml:{line + 1}: .*keeps only its newest 2"
    ):
        curve_steps(load_config(recipe, ["training.keep_checkpoints=2"]))


def test_the_demo_says_what_it_will_do_as_its_recipe_says() -> None:
    """The recipe's choices, read from the config, before the demo starts: another config,
    another account."""
    shipped = " ".join(demo_recipe(load_config(DEMO)).split())
    for choice in (
        "120 steps of 8 mentions with 8 negatives each",
        "- mixed-50: 50% of each mention's negatives from the top 32 of the negative cache",
        "no initial negatives: the cache holds the vectors the steps compute, so the first step's "
        "negatives are random",
        "re-encoded beside training only when it pays: the hard negatives drawn are 20+ steps "
        "old on average",
        "cosine scores / temperature 0.05; every mention scored against every candidate",
        "1000 held-out mentions of synsets a training mention links to (seen) and 1000 of "
        "synsets none does (unseen), over 5000 synsets",
    ):
        assert choice in shipped, (choice, shipped)
    changed = " ".join(
        demo_recipe(
            load_config(
                DEMO,
                [
                    "training.steps=90",
                    "negatives.mixed.hard_fraction=0.25",
                    "negatives.initial=random",
                    "refresh.trigger=stale",
                    "model.normalize=false",
                    "loss.temperature=null",
                    "negatives.share=none",
                    "negatives.cache.enabled=false",
                ],
            )
        ).split()
    )
    for choice in (
        "90 steps of 8 mentions",
        "- mixed-25: 25% of each mention's negatives from the top 32 of the newest index",
        "random negatives until the first refresh lands",
        "re-encoded beside training when the negatives go stale",
        "dot-product scores; each mention scored against its own candidates",
    ):
        assert choice in changed, (choice, changed)
    assert "temperature" not in changed and "initial negatives" not in changed
    from_model = " ".join(demo_recipe(load_config(DEMO, ["negatives.initial=model"])).split())
    assert (
        "initial negatives mined with the starting model: hard negatives from step 1" in from_model
    )
    baseline_sampler = demo_recipe(
        load_config(DEMO, ["negatives.sampler=random", "negatives.cache.enabled=false"])
    )
    assert "- recipe: random: negatives.sampler: random" in baseline_sampler


def publish(run_dir: Path, step: int, log: EventLog) -> None:
    """A complete checkpoint of ``step`` (its export and marker) and its ``checkpoint`` event."""
    directory = checkpoint_dir(run_dir, step)
    (directory / EXPORT_DIR).mkdir(parents=True)
    (directory / COMPLETE).write_text("")
    log.write(RunEvent.CHECKPOINT, step=step, path=str(directory))


def test_the_curve_evaluates_each_checkpoint_at_its_publication_seconds(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    started = time.time()
    log = EventLog(run_dir)
    for step in (15, 30, 45, 60):
        publish(run_dir, step, log)
        time.sleep(0.01)
    evaluated = []

    def evaluate(export: Path, label: str) -> RecallReport:
        evaluated.append((export, label))
        step = int(export.parent.name.split("-")[1])
        return RecallReport(label, 10, 100, {1: step / 100, 64: 1.0}, {1: 0.0})

    points = training_curve("mixed-50", run_dir, started, [30], evaluate)
    published = {e["step"]: e["time"] - started for e in read_events(run_dir, RunEvent.CHECKPOINT)}
    assert [(p.step, p.seconds, p.recall[1]) for p, _ in points] == [
        (30, published[30], 0.30),
        (60, published[60], 0.60),
    ]
    assert published[30] < published[60]
    assert evaluated == [
        (checkpoint_dir(run_dir, 30) / EXPORT_DIR, "mixed-50, step 30"),
        (checkpoint_dir(run_dir, 60) / EXPORT_DIR, "trained, mixed-50"),
    ]
    (checkpoint_dir(run_dir, 30) / COMPLETE).unlink()
    with pytest.raises(RuntimeError, match=r"step-30: no complete checkpoint"):
        training_curve("mixed-50", run_dir, started, [30], evaluate)


def test_the_curve_is_printed_and_plotted(tmp_path: Path) -> None:
    curve = [
        CurvePoint(run, step, seconds, {1: r1, 64: 0.9})
        for run, points in {"random": [(0, 0.0, 0.25), (60, 140.0, 0.5)]}.items()
        for step, seconds, r1 in points
    ] + [CurvePoint("mixed-50", 60, 200.0, {1: 0.52, 64: 0.99})]
    table = curve_table(curve).splitlines()
    assert table[0].split() == ["run", "step", "seconds", "R@1", "R@64"]
    assert table[2].split() == ["random", "60", "140", "0.500", "0.900"]
    assert table[3].split() == ["mixed-50", "60", "200", "0.520", "0.990"]
    out = plot_curve(curve, tmp_path / "demo_recall.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    apart = [
        CurvePoint(
            run,
            60,
            100.0,
            {1: 0.5, 64: 0.9},
            {"seen": {1: r1, 64: 1.0}, "unseen": {1: 0.4, 64: 0.8}},
        )
        for run, r1 in (("random", 0.55), ("mixed-50", 0.6))
    ]
    table = curve_table(apart).splitlines()
    assert table[0].split() == [
        "run",
        "step",
        "seconds",
        "R@1",
        "R@64",
        "R@1",
        "seen",
        "R@1",
        "unseen",
    ]
    assert table[2].split()[-2:] == ["0.600", "0.400"]
    assert plot_curve(apart, tmp_path / "apart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_verdict_gives_each_split_and_cutoff_its_paired_interval() -> None:
    """The recipe's run against random on seen and unseen entities apart, at each k, from the
    runs' per-mention hits: the difference, its paired 95% interval, and where it lies."""
    seen = np.array([True] * 200 + [False] * 200)
    # seen: the recipe finds 40 more at R@1 (clearly above 0); unseen: 2 fewer (includes 0)
    random_hits = np.zeros((400, 2), bool)
    random_hits[:100, 0] = random_hits[200:300, 0] = True
    random_hits[:, 1] = True
    recipe_hits = random_hits.copy()
    recipe_hits[100:140, 0] = True
    recipe_hits[200:202, 0] = False

    def report(name: str, hits: np.ndarray | None) -> RecallReport:
        recall = {1: 0.5, 64: 1.0}
        return RecallReport(name, 400, 8000, recall, recall, hits=hits, seen=seen)

    result = DemoResult(
        [
            report("untrained", None),
            report("trained, random", random_hits),
            report("trained, mixed-50", recipe_hits),
        ],
        {},
        {},
        {},
        [],
    )
    lines = demo_verdict(result)
    assert [line.split(":")[0] for line in lines] == [
        "seen entities, R@1",
        "seen entities, R@64",
        "unseen entities, R@1",
        "unseen entities, R@64",
    ]
    assert lines[0].startswith("seen entities, R@1: mixed-50 - random = +0.200 [")
    assert lines[0].endswith("over 200 mentions): mixed-50 ahead, the interval above 0")
    assert "= +0.000 [+0.000, +0.000]" in lines[1] and lines[1].endswith(
        "neither ahead, the interval includes 0"
    )
    assert lines[2].startswith("unseen entities, R@1: mixed-50 - random = -0.010 [")
    assert lines[2].endswith("random ahead, the interval includes 0")
