"""What every command that runs on a recipe shares: ``--config``, repeated ``--set``, and loading.

The recipe is loaded and validated before anything else happens (no Ray, no model), and the
software and devices this process sees are logged once (``hnce.cluster.compute.session.describe_environment``).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from hnce.pipeline.config import Config, load_config

CONFIGS_DIR = Path(__file__).resolve().parents[2] / "configs"
logger = logging.getLogger("hnce")


def add_config_arguments(parser: argparse.ArgumentParser, default: Path | None = None) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        default=default,
        help="YAML recipe (configs/*.yaml, or a run's config.yaml)"
        + (f"; default {default}" if default else "; default: built-in defaults"),
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one setting, e.g. --set training.steps=200 (repeatable)",
    )


def load_recipe(args: argparse.Namespace, *extra_overrides: str) -> Config:
    """The validated recipe of ``--config`` / ``--set`` (then ``extra_overrides``, from a
    command's own flags); raises ConfigError naming the key before any work."""
    config = load_config(args.config, [*args.overrides, *extra_overrides])
    from hnce.cluster.compute.session import choose_accelerator, describe_environment

    logger.info(
        "recipe %s; %s; DeepSpeed accelerator %s",
        args.config or "(defaults)",
        describe_environment(),
        choose_accelerator(config.cluster),
    )
    return config
