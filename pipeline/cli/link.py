"""``hnce link``: the top-k catalogue entities of mentions marked in text, with a trained model.

Texts mark each mention with ``[START_ENT]`` … ``[END_ENT]`` and come as arguments, one per line
of stdin (blank lines passed over), as KILT AIDA files (``--kilt``) or as BLINK mention files
(``--blink``; Zeshel's mentions point into its documents: convert them with ``hnce data zeshel``
and evaluate instead); every input is read and
checked before any model or Ray starts, and a bad one is an error naming it (``argument 2``,
``stdin line 3``, ``FILE:LINE``). The recipe is loaded as ``hnce eval`` loads it. Each
candidate shows the start of its entity's text, rows cut to the terminal's width (to
:data:`PIPED_WIDTH` where stdout is not a terminal); ``--json`` gives the whole text.

    hnce link --config runs/wordnet/config.yaml "He sat on the [START_ENT] bank [END_ENT]."
    hnce link --config runs/wordnet/config.yaml --json < marked.txt
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from hnce.errors import InputError
from hnce.pipeline.cli._common import add_config_arguments, load_recipe
from hnce.text import stdin_lines

if TYPE_CHECKING:
    from hnce.cluster.stores.tables import Mention

#: the width of the table written where stdout is not a terminal (a file, a pipe)
PIPED_WIDTH = 100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument(
        "texts",
        nargs="*",
        metavar="TEXT",
        help="a text marking each mention with [START_ENT] ... [END_ENT] (default: one text per "
        "line of stdin)",
    )
    parser.add_argument(
        "--kilt",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="link every line of these KILT AIDA files instead (their meta or marked input)",
    )
    parser.add_argument(
        "--blink",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="link every line of these BLINK mention files instead "
        "({context_left, mention, context_right} JSON lines, as BLINK's main_dense.py reads)",
    )
    model = parser.add_mutually_exclusive_group()
    model.add_argument(
        "--checkpoint",
        default="newest",
        help="'newest' (the run's newest complete checkpoint), 'untrained' (model.path), "
        "or a checkpoint's step-<S>/ or export/ directory",
    )
    model.add_argument(
        "--export",
        type=Path,
        help="a bi-encoder export directory instead (its index built once into <run>/eval-index/)",
    )
    parser.add_argument("-k", type=int, default=8, help="candidates per mention (default 8)")
    parser.add_argument(
        "--json",
        action="store_true",
        help="JSON lines, one object per mention, for programs (each candidate with its "
        "entity's whole text)",
    )
    parser.add_argument(
        "--rerank",
        type=Path,
        metavar="RERANKER_RUN",
        help="reorder the retriever's top rerank.num_candidates with a trained joint reranker: "
        "its run (<run>/rerank, or the run holding it; newest checkpoint) or its export",
    )


def read_mentions(args: argparse.Namespace) -> list[Mention]:
    """The mentions of the command's inputs, each checked (``hnce.pipeline.link``)."""
    from hnce.pipeline.data.blink import read_blink_mentions
    from hnce.pipeline.data.kilt_predictions import as_mentions, read_kilt_inputs
    from hnce.pipeline.link import texts_mentions

    if sum(bool(given) for given in (args.texts, args.kilt, args.blink)) > 1:
        raise InputError("give texts, --kilt files or --blink files, one of them")
    for path in (args.kilt or []) + (args.blink or []):
        if not path.is_file():
            raise InputError(f"{path}: no such file")
    if args.kilt:
        mentions = [m for path in args.kilt for m in as_mentions(read_kilt_inputs(path))]
    elif args.blink:
        mentions = [m for path in args.blink for m in read_blink_mentions(path)]
    elif args.texts:
        sources = [f"argument {number}" for number in range(1, len(args.texts) + 1)]
        mentions = texts_mentions(args.texts, sources)
    else:
        lines = [(number, line) for number, line in stdin_lines() if line.strip()]
        sources = [f"stdin line {number}" for number, _ in lines]
        mentions = texts_mentions([line for _, line in lines], sources)
    if not mentions:
        raise InputError("no text to link: give texts as arguments, on stdin, --kilt or --blink")
    return mentions


def run(args: argparse.Namespace) -> int:
    config = load_recipe(args)
    if args.k < 1:
        raise InputError(f"-k must be at least 1 (got {args.k})")
    mentions = read_mentions(args)
    from hnce.pipeline.link import EntityLinker, format_linked

    with EntityLinker.from_config(config, args.checkpoint, args.export, args.rerank) as linker:
        linked = linker.link_mentions(mentions, args.k)
    if args.json:
        for item in linked:
            print(json.dumps(item.to_json(), ensure_ascii=False))
    else:
        print(format_linked(linked, output_width()))
    return 0


def output_width() -> int:
    """The terminal's width where stdout is one; elsewhere a fixed width, so that what a file or
    a program receives does not depend on the terminal the command was started from."""
    return shutil.get_terminal_size().columns if sys.stdout.isatty() else PIPED_WIDTH
