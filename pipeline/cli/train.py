"""``hnce train``: DeepSpeed training under Ray Train on asynchronously refreshed negatives."""

from __future__ import annotations

import argparse
import sys

from hnce.pipeline.cli._common import add_config_arguments, load_recipe


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    config = load_recipe(args)
    from hnce.pipeline.train.trainer import run_training

    summary = run_training(config)
    print(summary.line())
    if summary.refresh_error:
        print(f"refresh error: {summary.refresh_error}", file=sys.stderr)
    print(f"checkpoints: {summary.run_dir / 'checkpoints'}")
    return 0
