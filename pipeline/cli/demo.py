"""``hnce demo``: WordNet + MiniLM, trained on random and on mixed-50 refreshed negatives."""

from __future__ import annotations

import argparse

from hnce.pipeline.cli._common import CONFIGS_DIR, add_config_arguments, load_recipe


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, default=CONFIGS_DIR / "demo.yaml")


def run(args: argparse.Namespace) -> int:
    config = load_recipe(args)
    from hnce.pipeline.demo import demo_summary, run_demo

    result = run_demo(config, announce=lambda text: print(text, flush=True))
    print()
    print(demo_summary(result, config.run_dir))
    return 0
