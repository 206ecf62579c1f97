"""Entry point of the `hnce` console script: logging, the one error handler, then a subcommand.

Each subcommand lives in its own module `hnce.pipeline.cli.<name>` exposing
`add_arguments(parser: argparse.ArgumentParser) -> None` and `run(args: argparse.Namespace) -> int`.
Modules are imported only when their command runs, so `hnce --help` does not pay for importing
torch, Ray or DeepSpeed.

A mistake of the user's (a bad recipe, a bad input row, a missing file: ``InputError``, also when
it happened inside a Ray actor or worker) ends in one line naming the file and line, and exit
status 2. What the machine refuses (a full disk, a read-only file system, a permission) is one
line naming the file, exit 74; a command refused by a run's lock (a second ``hnce train`` of a run
that is training) is one line naming the holder, exit 75 (EX_TEMPFAIL: try again later); an
interrupt (SIGINT) exits 130 with one line, a stop on SIGTERM 143 with one line saying where the
same command resumes (docs/failures.md, "Preemption"). Anything else is a
bug of ours and keeps its traceback. ``--debug`` shows tracebacks for everything and logs at
DEBUG level.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import signal
import sys
from collections.abc import Callable

from hnce.cluster.stores.lock_holder import EXIT_LOCKED, RunLocked
from hnce.errors import InputError, Terminated
from hnce.progress import quiet
from hnce.text import NotText, argument_text

EXIT_INPUT_ERROR = 2
EXIT_IO_ERROR = 74  # sysexits' EX_IOERR: a full disk, a file system that refuses a write
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 143  # 128 + SIGTERM
#: sysexits' EX_UNAVAILABLE: an actor lost mid-work (its node died, it was killed) or hung
EXIT_CLUSTER_LOST = 69
# What the machine refuses, not the program (a failing disk's EIO too): said in one line, never
# a traceback.
IO_ERRORS = {
    errno.ENOSPC,
    errno.EDQUOT,
    errno.EFBIG,
    errno.EIO,
    errno.EACCES,
    errno.EPERM,
    errno.EROFS,
}

COMMANDS: dict[str, tuple[str, str]] = {
    "data": (
        "hnce.pipeline.cli.data",
        "convert Zeshel / KILT / BLINK / WordNet / synthetic data to Parquet",
    ),
    "train": (
        "hnce.pipeline.cli.train",
        "train a retriever with DeepSpeed under Ray on refreshed negatives",
    ),
    "refresh": (
        "hnce.pipeline.cli.refresh",
        "re-encode the catalogue into a new index version and mine negatives",
    ),
    "status": (
        "hnce.pipeline.cli.status",
        "a run's checkpoints, live versions, lag, refreshes, lock and disk on one screen",
    ),
    "eval": ("hnce.pipeline.cli.eval", "recall@k and accuracy against the whole catalogue"),
    "link": ("hnce.pipeline.cli.link", "the top-k entities of mentions marked in text"),
    "export": (
        "hnce.pipeline.cli.export",
        "a checkpoint's towers as sentence-transformers directories, with its FAISS index",
    ),
    "bias": ("hnce.pipeline.cli.bias", "gradient-bias diagnostics of NCE negatives (paper §6.4)"),
    "demo": ("hnce.pipeline.cli.demo", "the main job end to end on real WordNet data"),
    "rerank": ("hnce.pipeline.cli.rerank", "train and evaluate the joint (cross-encoder) reranker"),
    "plan": (
        "hnce.pipeline.cli.plan",
        "memory per process (trainer worker, index shard) for a recipe",
    ),
    "finetune-blink": (
        "hnce.pipeline.cli.finetune_blink",
        "fine-tune BLINK on KILT AIDA against the whole catalogue",
    ),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hnce",
        description="Dense entity retrieval trained on asynchronously refreshed hard negatives.",
    )
    parser.add_argument(
        "--debug", action="store_true", help="tracebacks for every error; DEBUG logging"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        if name == command:
            importlib.import_module(module_name).add_arguments(sub)
        _add_no_progress(sub)
    return parser


def _add_no_progress(parser: argparse.ArgumentParser) -> None:
    """``--no-progress`` (alias ``--quiet``) on a command and on each of its own subcommands
    (``hnce data kilt --no-progress``); a subcommand's copy never resets the command's."""
    parser.add_argument(
        "--no-progress",
        "--quiet",
        action="store_true",
        default=argparse.SUPPRESS,
        help="no progress bars (and no periodic progress lines in logs)",
    )
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _add_no_progress(child)


def configure_logging(debug: bool) -> None:
    """One logging set-up for every command: device and engine choices are always visible."""
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    for noisy in ("urllib3", "filelock", "matplotlib", "PIL", "faiss.loader"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _behind(error: BaseException, wanted: Callable[[BaseException], bool]) -> BaseException | None:
    """The first exception behind ``error`` that is ``wanted``: itself, or what Ray wrapped it
    in when it happened in an actor, a task, a Ray Train worker (``worker_failures``, whole,
    not the truncated snippet of the message) or the Ray Train controller."""
    pending: list[BaseException] = [error]
    seen: set[int] = set()
    while pending:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        cause = getattr(current, "cause", None)
        if wanted(current) and not isinstance(cause, BaseException):
            return current
        wrapped = [cause, current.__cause__, getattr(current, "controller_failure", None)]
        wrapped += list((getattr(current, "worker_failures", None) or {}).values())
        pending += [inner for inner in wrapped if isinstance(inner, BaseException)]
    return None


def user_error(error: BaseException) -> InputError | None:
    """The :class:`InputError` behind ``error`` (:func:`_behind`)."""
    found = _behind(error, lambda current: isinstance(current, InputError))
    return found if isinstance(found, InputError) else None


def io_error(error: BaseException) -> OSError | None:
    """The full disk, read-only file system or refused permission behind ``error``."""
    found = _behind(
        error, lambda current: isinstance(current, OSError) and current.errno in IO_ERRORS
    )
    return found if isinstance(found, OSError) else None


def cluster_failure(error: BaseException) -> BaseException | None:
    """An actor Ray lost (its node died, it was killed or preempted) or one that hung past its
    deadline (``TaskTimeout``), behind ``error`` (:func:`_behind`); None when no Ray ran here."""
    if "ray" not in sys.modules:
        return None
    from ray.exceptions import RayActorError

    from hnce.cluster.compute.actors import TaskTimeout

    return _behind(error, lambda current: isinstance(current, RayActorError | TaskTimeout))


def _terminate(signum: int, frame: object) -> None:
    raise Terminated


def main(argv: list[str] | None = None) -> int:
    try:
        argv = argument_text(sys.argv[1:] if argv is None else argv)
    except NotText as error:  # before Ray or a subcommand sees it (docs/failures.md)
        print(f"hnce: {error}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    parser = build_parser(command if command in COMMANDS else None)
    args = parser.parse_args(argv)
    configure_logging(args.debug)
    signal.signal(signal.SIGTERM, _terminate)  # a command with its own (hnce refresh) replaces it
    try:
        module = importlib.import_module(COMMANDS[args.command][0])
        with quiet(getattr(args, "no_progress", False)):
            return int(module.run(args) or 0)
    except KeyboardInterrupt as interrupt:
        print(f"hnce {args.command}: {interrupt or 'interrupted'}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Terminated as stop:
        said = str(stop) or "terminated (SIGTERM); the same command resumes"
        print(f"hnce {args.command}: {said}", file=sys.stderr)
        return EXIT_TERMINATED
    except Exception as error:
        if args.debug:
            raise
        if isinstance(error, RunLocked):
            print(f"hnce {args.command}: {error}", file=sys.stderr)
            return EXIT_LOCKED
        if (found := user_error(error)) is not None:
            print(f"hnce {args.command}: {found}", file=sys.stderr)
            return EXIT_INPUT_ERROR
        if (lost := cluster_failure(error)) is not None:
            said = " ".join(str(lost).split())[:500] or type(lost).__name__
            print(
                f"hnce {args.command}: {type(lost).__name__}: {said} (an actor lost mid-work or "
                f"hung; nothing unfinished was published: run the command again once the "
                f"cluster has the resources)",
                file=sys.stderr,
            )
            return EXIT_CLUSTER_LOST
        if (refused := io_error(error)) is not None:
            where = f"{refused.filename}: " if refused.filename else ""
            print(f"hnce {args.command}: {where}{refused.strerror}", file=sys.stderr)
            return EXIT_IO_ERROR
        raise


if __name__ == "__main__":
    sys.exit(main())
