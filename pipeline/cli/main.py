"""Entry point of the `hnce` console script.

Each subcommand lives in its own module `pipeline.cli.<name>` exposing
`add_arguments(parser: argparse.ArgumentParser) -> None` and `run(args: argparse.Namespace) -> int`.
Modules are imported only when their command runs, so `hnce --help` does not pay for importing
torch, Ray or DeepSpeed.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "data": (
        "pipeline.cli.data",
        "convert Zeshel / KILT / BLINK / WordNet / synthetic data to Parquet",
    ),
    "train": (
        "pipeline.cli.train",
        "train a retriever with DeepSpeed under Ray on refreshed negatives",
    ),
    "refresh": (
        "pipeline.cli.refresh",
        "re-encode the catalogue into a new index version and mine negatives",
    ),
    "eval": ("pipeline.cli.eval", "recall@k and accuracy against the whole catalogue"),
    "bias": ("pipeline.cli.bias", "gradient-bias diagnostics of NCE negatives (paper §6.4)"),
    "demo": ("pipeline.cli.demo", "the main job end to end on real WordNet data"),
    "rerank": ("pipeline.cli.rerank", "train and evaluate the joint (cross-encoder) reranker"),
    "finetune-blink": (
        "pipeline.cli.finetune_blink",
        "fine-tune BLINK on KILT AIDA against the whole catalogue",
    ),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hnce",
        description="Dense entity retrieval trained on asynchronously refreshed hard negatives.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        if name == command:
            importlib.import_module(module_name).add_arguments(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    parser = build_parser(command if command in COMMANDS else None)
    args = parser.parse_args(argv)
    module = importlib.import_module(COMMANDS[args.command][0])
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
