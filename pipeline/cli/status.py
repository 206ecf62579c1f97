"""``hnce status RUN_DIR``: a run's training, checkpoints, live versions, lag, refreshes, lock
holder and disk use on one screen; ``--json`` for monitoring; ``--plot FILE.png`` draws the
training curves. The logic lives in ``hnce.pipeline.status``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the run directory (run.dir)")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the screen")
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help="also draw loss, negatives lag and held-out recall against steps and wall-clock",
    )


def run(args: argparse.Namespace) -> int:
    from hnce.pipeline.run import refuse_inside_stores
    from hnce.pipeline.status import plot_training, run_status

    if args.plot:
        refuse_inside_stores(args.plot, args.run_dir, "--plot")
    status = run_status(args.run_dir)
    plot = plot_training(args.run_dir, args.plot) if args.plot else None
    shown = json.dumps(status.to_json(), indent=2, allow_nan=False) if args.json else None
    print(shown or status.render())
    if plot is not None:
        print(f"plot {plot}", file=sys.stderr)
    return 0
