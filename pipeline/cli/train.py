"""``hnce train``: DeepSpeed training under Ray Train on asynchronously refreshed negatives."""

from __future__ import annotations

import argparse
import sys

from pipeline.cli._common import add_config_arguments, config_from_args
from pipeline.config import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
    except ConfigError as error:
        print(f"hnce train: {error}", file=sys.stderr)
        return 2
    from pipeline.train.trainer import run_training

    summary = run_training(config, progress=not args.no_progress)
    print(summary.line())
    if summary.refresh_error:
        print(f"refresh error: {summary.refresh_error}", file=sys.stderr)
    print(f"checkpoints: {summary.run_dir / 'checkpoints'}")
    return 0
