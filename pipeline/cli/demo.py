"""``hnce demo``: WordNet + MiniLM, trained on random and on mixed-50 refreshed negatives."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.cli._common import CONFIGS_DIR, add_config_arguments, config_from_args
from pipeline.config import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, default=CONFIGS_DIR / "demo.yaml")


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
    except ConfigError as error:
        print(f"hnce demo: {error}", file=sys.stderr)
        return 2
    from pipeline.demo import demo_table, run_demo

    work_dir = Path(config.run.dir)
    result = run_demo(config, work_dir, announce=lambda text: print(text, flush=True))
    print()
    print(
        f"WordNet demo: {result.counts['train_mentions']} training mentions, "
        f"{result.counts['eval_mentions']} held-out mentions (lemmas unseen in training), "
        f"{result.counts['entities']} synsets in the catalogue"
    )
    print(demo_table(result))
    for name, training in result.trainings.items():
        print(f"{name}: {training.line()}")
    timings = ", ".join(f"{k} {v:.0f}s" for k, v in result.seconds.items())
    print(f"timings: {timings}")
    print(f"results: {work_dir / 'demo_results.json'}")
    return 0
