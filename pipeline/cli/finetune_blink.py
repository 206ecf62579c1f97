"""``hnce finetune-blink``: BLINK's bi-encoder fine-tuned on KILT AIDA against the whole catalogue
(paper §6.8): convert, index version 0, mixed-50 training with the asynchronous refresh, accuracy
on dev/test, KILT predictions, and the model exported in Hugging Face and BLINK layouts."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.cli._common import CONFIGS_DIR, add_config_arguments, config_from_args
from pipeline.config import ConfigError
from pipeline.data.blink import DEFAULT_MAX_TEXT_CHARS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, default=CONFIGS_DIR / "aida-blink.yaml")
    parser.add_argument(
        "--blink-checkpoint",
        type=Path,
        required=True,
        help="BLINK bi-encoder state_dict (biencoder_wiki_large.bin), read with weights_only",
    )
    parser.add_argument(
        "--base-model",
        type=Path,
        required=True,
        help="local HF directory with the BERT config and vocabulary (bert-large-uncased)",
    )
    catalogue = parser.add_mutually_exclusive_group(required=True)
    catalogue.add_argument("--entities", type=Path, help="BLINK entity.jsonl")
    catalogue.add_argument("--knowledge-source", type=Path, help="kilt_knowledgesource.json")
    parser.add_argument(
        "--encodings",
        type=Path,
        default=None,
        help="BLINK's all_entities_large.t7 (rows = entity.jsonl rows): index version 0 "
        "without re-encoding (dual scorer only); default: encode with the checkpoint",
    )
    parser.add_argument(
        "--aida",
        type=Path,
        nargs="+",
        required=True,
        help="aidayago2-{train,dev,test_without_answers}-kilt.jsonl",
    )
    parser.add_argument("--max-text-chars", type=int, default=DEFAULT_MAX_TEXT_CHARS)
    parser.add_argument(
        "--index-shard-size", type=int, default=1_000_000, help="rows per shard of version 0"
    )
    parser.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
    except ConfigError as error:
        print(f"hnce finetune-blink: {error}", file=sys.stderr)
        return 2
    from pipeline.blink_finetune.recipe import BlinkInputs, finetune_blink

    try:
        inputs = BlinkInputs(
            checkpoint=args.blink_checkpoint,
            base_model=args.base_model,
            aida=args.aida,
            entities=args.entities,
            knowledge_source=args.knowledge_source,
            encodings=args.encodings,
            max_text_chars=args.max_text_chars,
            index_shard_size=args.index_shard_size,
        )
    except ValueError as error:
        print(f"hnce finetune-blink: {error}", file=sys.stderr)
        return 2
    report = finetune_blink(config, inputs, progress=not args.no_progress)
    print("\n".join(report.lines()))
    print(f"report: {report.run_dir / 'finetune_report.json'}")
    return 0
