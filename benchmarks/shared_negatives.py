"""Shared negatives (``negatives.share: batch``) against each mention's own (``none``) at equal
wall-clock, through the shipping trainer (``hnce train``: DeepSpeed under Ray Train).

The demo recipe (``configs/demo.yaml``: real WordNet, the packaged all-MiniLM-L6-v2) on a small
demo subset (``hnce.pipeline.demo.write_demo_subset``), random negatives with no refresh so that the
two runs differ only in which candidates each mention's NCE (eq. 5/11) is normalised over:
its own 1 + K, or every candidate of the micro-batch but its known positives (≈ B·(1+K)).
Both runs take the same number of steps; the seconds each took (sum of the logged step times)
are reported beside R@1/R@8/R@64 of the held-out mentions (``hnce.pipeline.evaluate``), so the
comparison is at equal steps and the table says whether the time was equal too.

    .venv/bin/python -m benchmarks.shared_negatives      # ~10 min on 2 busy cores

writes ``benchmarks/results/shared_negatives.md`` and rebuilds BENCHMARKS.md.
"""

from __future__ import annotations

from pathlib import Path

import ray

from benchmarks import harness
from benchmarks.training_runs import checkpoint_export
from benchmarks.wordnet_runs import prepare_dataset, recipe, wordnet_arguments
from hnce.events import RunEvent
from hnce.pipeline.config import Config, config_from_dict
from hnce.pipeline.evaluate import evaluate_export
from hnce.pipeline.event_log import read_events
from hnce.pipeline.train.trainer import run_training
from hnce.progress import quiet

KS = [1, 8, 64]


def share_recipe(run_dir: Path, data_root: Path, share: str, steps: int) -> Config:
    """The demo recipe with random negatives, no refresh, and ``negatives.share: share``."""
    return recipe(
        run_dir,
        data_root,
        f"training.steps={steps}",
        "training.warmup_steps=3",
        "training.log_every=1",
        f"training.checkpoint_every={steps}",
        "training.num_workers=1",
        "training.batch_size=8",
        "negatives.num_negatives=4",
        "negatives.sampler=random",
        "negatives.cache.enabled=false",
        "negatives.source=none",
        "negatives.initial=random",
        "model.normalize=false",  # dot products, as measured
        "loss.options={}",
        f"negatives.share={share}",
        "refresh.enabled=false",
    )


def train_and_evaluate(config: Config) -> tuple[float, dict[int, float]]:
    """Seconds spent in training steps, and recall of the final checkpoint on the test split."""
    run_training(config)
    seconds = sum(event["seconds"] for event in read_events(config.run_dir, RunEvent.STEP))
    tree = config.to_dict()
    tree["eval"].update(ks=KS, per_domain_catalogue=False)
    export = checkpoint_export(config.run_dir)
    report = evaluate_export(config_from_dict(tree), export)
    return seconds, report.recall


@quiet()  # no progress bars from hnce in this process
def main() -> None:
    parser = wordnet_arguments(
        __doc__, "shared_negatives", Path("runs/bench-shared-negatives"), 1500, 400, 150, steps=30
    )
    args = harness.parse(parser)
    data = prepare_dataset(args.work_dir, args.entities, args.train_mentions, args.test_mentions)
    rows = []
    for share in ("none", "batch"):
        config = share_recipe(args.work_dir / f"run-{share}", data, share, args.steps)
        seconds, recall = train_and_evaluate(config)
        rows.append((share, seconds, recall))
        ray.shutdown()
    lines = [
        "# Shared negatives at equal steps (WordNet, MiniLM, hnce train)",
        "",
        f"Demo recipe on a {args.entities}-synset WordNet subset, {args.train_mentions} training "
        f"and {args.test_mentions} held-out mentions, {args.steps} steps of 8 mentions × 4 random negatives, 1 DeepSpeed worker "
        "under Ray Train, no refresh. `none`: each mention's NCE over its own 1 + 4 candidates; "
        "`batch`: over every candidate of the micro-batch but its known positives (≈ 39). "
        "Seconds: sum of the logged step times (candidates are encoded once either way).",
        "",
        "| share | train seconds | R@1 | R@8 | R@64 |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {share} | {seconds:.0f} | {recall[1]:.3f} | {recall[8]:.3f} | {recall[64]:.3f} |"
        for share, seconds, recall in rows
    ]
    harness.write_result(args.output, lines)


if __name__ == "__main__":
    main()
