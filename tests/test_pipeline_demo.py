"""``hnce demo``'s recall against wall-clock: which checkpoints it evaluates (``demo.curve_every``,
refused with the key's file and line when a run would not write or keep them), each one's wall
seconds from its run's event log, and the table and plot it prints and saves. The whole demo runs
from a clean clone (`bash scripts/demo.sh`), not in the suite: it takes minutes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hnce.cluster.compute.recall import RecallReport
from hnce.cluster.stores.checkpoints import COMPLETE, EXPORT_DIR, checkpoint_dir
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
from hnce.pipeline.event_log import EventLog, read_events

DEMO = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"


def test_the_demo_evaluates_every_curve_every_steps_and_refuses_checkpoints_it_would_not_have(
    tmp_path: Path,
) -> None:
    assert curve_steps(load_config(DEMO)) == []
    assert curve_steps(
        load_config(DEMO, ["demo.curve_every=30", "training.keep_checkpoints=8"])
    ) == [30, 60, 90]
    with pytest.raises(ConfigError, match=r"--set demo.curve_every=20: .*must be a multiple of"):
        curve_steps(load_config(DEMO, ["demo.curve_every=20"]))
    recipe = tmp_path / "short-memory.yaml"
    lines = DEMO.read_text().splitlines()
    line = next(i for i, text in enumerate(lines) if "curve_every:" in text)
    lines[line] = "  curve_every: 15"
    recipe.write_text("\n".join(lines) + "\n")
    with pytest.raises(
        ConfigError, match=rf"short-memory\.yaml:{line + 1}: .*keeps only its newest 3"
    ):
        curve_steps(load_config(recipe))


def test_the_demo_says_what_it_will_do_as_its_recipe_says() -> None:
    """The recipe's choices, read from the config, before the demo starts: another config,
    another account."""
    shipped = " ".join(demo_recipe(load_config(DEMO)).split())
    for choice in (
        "120 steps of 8 mentions with 8 negatives each",
        "- mixed-50: 50% of each mention's negatives from the top 32 of the negative cache",
        "version 0 mined with the starting model: hard negatives from step 1",
        "re-encoded beside training only when it pays: the hard negatives drawn are 20+ steps "
        "old on average",
        "cosine scores / temperature 0.05; every mention scored against every candidate",
        "400 held-out mentions whose lemmas training never saw, over 8000 synsets",
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
                    "loss.options={}",
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
    assert "temperature" not in changed and "version 0" not in changed
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


def test_the_verdict_names_the_winner_at_each_cutoff_against_the_measured_spread() -> None:
    """The recipe's run against random at each k: who won, by how much, and whether by more
    than twice the seeds' sd of that difference (no spread given: no such clause)."""

    def report(name: str, recall: dict[int, float]) -> RecallReport:
        return RecallReport(name, 400, 8000, recall, recall)

    result = DemoResult(
        [
            report("untrained", {1: 0.25, 8: 0.5, 64: 0.8}),
            report("trained, random", {1: 0.478, 8: 0.895, 64: 0.994}),
            report("trained, mixed-50", {1: 0.505, 8: 0.89, 64: 0.994}),
        ],
        {},
        {},
        {},
        [],
    )
    assert demo_verdict(result, {1: 0.006, 8: 0.01}) == [
        "R@1: mixed-50 0.505, random 0.478: mixed-50 by 0.027, beyond twice the seeds' sd of "
        "this difference (0.006, BENCHMARKS.md)",
        "R@8: mixed-50 0.890, random 0.895: random by 0.005, within twice the seeds' sd of "
        "this difference (0.010, BENCHMARKS.md)",
        "R@64: mixed-50 0.994, random 0.994: neither by 0.000",
    ]
