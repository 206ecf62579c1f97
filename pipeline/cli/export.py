"""``hnce export RUN_DIR_or_RECIPE --format sentence-transformers --out DIR [--no-index]``: a
run's checkpoint in a format other tools load, its towers with the index of the same checkpoint.
The logic lives in ``hnce.pipeline.export``."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from hnce.pipeline.export import FORMATS, SENTENCE_TRANSFORMERS

    parser.add_argument(
        "source",
        type=Path,
        metavar="RUN_DIR_or_RECIPE",
        help="the run directory (run.dir), or a recipe naming it",
    )
    parser.add_argument(
        "--checkpoint", default="newest", help="'newest' (default) or step-<S> of the run"
    )
    parser.add_argument(
        "--format",
        dest="export_format",
        choices=FORMATS,
        default=SENTENCE_TRANSFORMERS,
        help=f"what to write (default {SENTENCE_TRANSFORMERS}: one directory per tower)",
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="a new directory, published whole when complete"
    )
    parser.add_argument(
        "--no-index",
        dest="index",
        action="store_false",
        help="the towers alone: without OUT/index/, the checkpoint's FAISS index over the run's "
        "catalogue (found in the run, or built once through Ray's encoder actors)",
    )


def run(args: argparse.Namespace) -> int:
    from hnce.pipeline.export import export_run

    written = export_run(args.source, args.checkpoint, args.export_format, args.out, args.index)
    for part, directory in written.items():
        print(f"{part}: {directory}")
    return 0
