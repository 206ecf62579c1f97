"""The command line every benchmark shares.

Common flags, on every benchmark:

- ``--output FILE`` (alias ``--out``): the result file; its plot and raw JSON go beside it.
  Default: ``<output-dir>/<name>.md``.
- ``--output-dir DIR``: where result files go (default ``benchmarks/results``, the committed
  ones, which BENCHMARKS.md is assembled from; point it elsewhere for small trial runs).
- ``--nice N``: lower the benchmark's priority (and its child processes') by N, as ``nice -n N``
  would, for a run on a machine others use (:func:`lower_priority`).

Sizes and the work directory are declared by each benchmark with its own defaults, under one
spelling: ``--entities``, ``--steps``, ``--repeats``, ``--seed``... (any keyword of
:func:`arguments`, ``_`` written ``-``), ``--work-dir`` (aliases ``--workdir``, ``--work``).

Example::

    parser = arguments(__doc__, "cluster_search", entities=200_000, queries=512, repeats=3)
    parser.add_argument("--shards", type=int, default=8)
    args = parse(parser)            # args.output: benchmarks/results/cluster_search.md
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.harness.results import RESULTS

logger = logging.getLogger(__name__)

#: help of the size flags benchmarks share; others get none unless the benchmark adds its own
HELP = {
    "entities": "catalogue entities",
    "steps": "training steps",
    "repeats": "timed repeats of each measure; the best is reported",
    "queries": "queries searched",
    "k": "top-k kept per query",
    "dim": "vector dimension",
    "seed": "random seed",
    "seeds": "seeds per cell (0..N-1)",
    "batch_size": "rows per batch",
    "shard_size": "entities per index shard",
    "checkpoint_every": "steps between checkpoints",
    "train_mentions": "training mentions",
    "test_mentions": "held-out mentions",
}
_NO_WORK_DIR = object()


def arguments(
    doc: str | None,
    name: str | Callable[[argparse.Namespace], str] | None,
    work_dir: Path | object | None = _NO_WORK_DIR,
    **sizes: Any,
) -> argparse.ArgumentParser:
    """A parser described by ``doc``'s first line with the common flags, ``--work-dir`` when a
    default is given (None: a temporary directory) and one flag per keyword of ``sizes``, typed
    as its default. ``name`` (or ``name(args)``) names the default result file; None for a
    benchmark that only prints (no ``--output``)."""
    parser = argparse.ArgumentParser(description=((doc or "").strip().splitlines() or [""])[0])
    if name is not None:
        parser.add_argument(
            "--output",
            "--out",
            type=Path,
            default=None,
            help="result file (default: <output-dir>/<name>.md)",
        )
        parser.add_argument(
            "--output-dir",
            type=Path,
            default=RESULTS,
            help="result directory (default: %(default)s)",
        )
    parser.add_argument("--nice", type=int, default=0, help="lower the priority by N (nice -n N)")
    if work_dir is not _NO_WORK_DIR:
        parser.add_argument(
            "--work-dir",
            "--workdir",
            "--work",
            dest="work_dir",
            type=Path,
            default=work_dir,
            help="work directory, kept between runs (default: %(default)s)",
        )
    for size, default in sizes.items():
        kind = Path if isinstance(default, Path) else type(default)
        parser.add_argument(
            f"--{size.replace('_', '-')}", type=kind, default=default, help=HELP.get(size)
        )
    parser.set_defaults(result_name=name)
    return parser


def lower_priority(increment: int) -> None:
    """``nice -n increment`` for this process and its children, and, where this process leads
    its own session (started with ``setsid``, as a long benchmark left running is), the same
    nice value for the session's scheduler group. Linux's autogroup
    (``kernel.sched_autogroup_enabled``) shares the CPUs between sessions first and applies a
    process's nice only inside its session: a niced benchmark in a session of its own took half
    of this machine's 2 cores from the work beside it (the demo's steps ran at half speed)."""
    value = os.nice(increment)
    enabled = Path("/proc/sys/kernel/sched_autogroup_enabled")
    if not enabled.exists() or enabled.read_text().strip() != "1":
        return
    if os.getsid(0) == os.getpid():
        Path("/proc/self/autogroup").write_text(f"{value}\n")
        logger.info("benchmark session's scheduler group at nice %d", value)
    else:
        logger.warning(
            "nice %d applies within this session only; start the benchmark with setsid for "
            "the whole session's group to yield to other sessions",
            value,
        )


def parse(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line, lower the priority (``--nice``) and settle ``args.output``."""
    args = parser.parse_args(argv)
    if args.nice:
        lower_priority(args.nice)
    if args.result_name is not None and args.output is None:
        name = args.result_name(args) if callable(args.result_name) else args.result_name
        args.output = args.output_dir / f"{name}.md"
    return args


def invocation(module: str) -> str:
    """The command line that ran benchmark ``module`` (e.g. ``benchmarks.token_index``), as a
    result file quotes it."""
    return " ".join([f".venv/bin/python -m {module}", *sys.argv[1:]])
