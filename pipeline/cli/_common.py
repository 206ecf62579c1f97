"""Arguments shared by the training commands: ``--config`` and repeated ``--set key=value``."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.config import Config, load_config

CONFIGS_DIR = Path(__file__).resolve().parents[2] / "configs"


def add_config_arguments(parser: argparse.ArgumentParser, default: Path | None = None) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        default=default,
        help="YAML recipe (configs/*.yaml)" + (f"; default {default}" if default else ""),
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one setting, e.g. --set training.steps=200 (repeatable)",
    )


def config_from_args(args: argparse.Namespace) -> Config:
    """Load and validate the config before any work (raises ConfigError naming the key)."""
    return load_config(args.config, args.overrides)
