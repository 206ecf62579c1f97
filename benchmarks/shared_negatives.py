"""Shared negatives (``negatives.share: batch``) against each mention's own (``none``) at equal
wall-clock, through the shipping trainer (``hnce train``: DeepSpeed under Ray Train).

The demo recipe (``configs/demo.yaml``: real WordNet, the packaged all-MiniLM-L6-v2) on a small
demo subset (``hnce.pipeline.demo.write_demo_subset``), random negatives with no refresh so that the
two runs differ only in which candidates each mention's NCE (eq. 5/11) is normalised over:
its own 1 + K, or every candidate of the micro-batch but its known positives (≈ B·(1+K)).
Both runs take the same number of steps; the seconds each took (sum of the logged step times)
are reported beside R@1/R@8/R@64 of the held-out mentions (``hnce.pipeline.evaluate``), so the
comparison is at equal steps and the table says whether the time was equal too.

    .venv/bin/python benchmarks/shared_negatives.py      # ~10 min on 2 busy cores

writes ``benchmarks/results/shared_negatives.md`` and rebuilds BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import ray
from report import write_result

from hnce.cluster.stores.checkpoints import EXPORT_DIR, newest_checkpoint
from hnce.pipeline.config import Config, config_from_dict, load_config
from hnce.pipeline.data.wordnet import convert_wordnet
from hnce.pipeline.demo import write_demo_subset
from hnce.pipeline.evaluate import evaluate_export
from hnce.pipeline.train.events import read_events
from hnce.pipeline.train.trainer import run_training

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
KS = [1, 8, 64]


def recipe(run_dir: Path, data_root: Path, share: str, steps: int) -> Config:
    return load_config(
        ROOT / "configs" / "demo.yaml",
        [
            f"run.dir={run_dir}",
            f"data.root={data_root}",
            f"training.steps={steps}",
            "training.warmup_steps=3",
            "training.log_every=1",
            f"training.checkpoint_every={steps}",
            "training.num_workers=1",
            "training.batch_size=8",
            "negatives.num_negatives=4",
            "negatives.sampler=random",
            "negatives.source=none",
            f"negatives.share={share}",
            "refresh.enabled=false",
        ],
    )


def train_and_evaluate(config: Config) -> tuple[float, dict[int, float]]:
    """Seconds spent in training steps, and recall of the final checkpoint on the test split."""
    run_training(config, progress=False)
    seconds = sum(event["seconds"] for event in read_events(config.run_dir, "step"))
    newest = newest_checkpoint(config.run_dir)
    assert newest is not None
    tree = config.to_dict()
    tree["eval"].update(ks=KS, per_domain_catalogue=False)
    report = evaluate_export(config_from_dict(tree), newest[1] / EXPORT_DIR, progress=False)
    return seconds, report.recall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("runs/bench-shared-negatives"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--entities", type=int, default=1500)
    args = parser.parse_args()
    data = args.workdir / "wordnet"
    if not (data / "subset").is_dir():
        convert_wordnet(data / "full")
        write_demo_subset(data / "full", data / "subset", args.entities, 400, 150, "test", seed=0)
    rows = []
    for share in ("none", "batch"):
        config = recipe(args.workdir / f"run-{share}", data / "subset", share, args.steps)
        seconds, recall = train_and_evaluate(config)
        rows.append((share, seconds, recall))
        ray.shutdown()
    lines = [
        "# Shared negatives at equal steps (WordNet, MiniLM, hnce train)",
        "",
        f"Demo recipe on a {args.entities}-synset WordNet subset, 400 training and 150 held-out "
        f"mentions, {args.steps} steps of 8 mentions × 4 random negatives, 1 DeepSpeed worker "
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
    write_result(RESULTS / "shared_negatives.md", lines)


if __name__ == "__main__":
    main()
