"""``hnce finetune-blink``: BLINK's bi-encoder fine-tuned on KILT AIDA against the whole catalogue
(paper §6.8): convert, index version 0, mixed-50 training with the asynchronous refresh, accuracy
on dev/test, KILT predictions, and the model exported in Hugging Face and BLINK layouts.

The inputs are the recipe's ``blink`` section; each flag below sets one of its keys.
"""

from __future__ import annotations

import argparse

from hnce.pipeline.cli._common import CONFIGS_DIR, add_config_arguments, load_recipe

# flag -> blink.<key>
INPUT_FLAGS = {
    "blink_checkpoint": "checkpoint",
    "base_model": "base_model",
    "entities": "entities",
    "knowledge_source": "knowledge_source",
    "encodings": "encodings",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, default=CONFIGS_DIR / "aida-blink.yaml")
    parser.add_argument(
        "--blink-checkpoint",
        help="BLINK bi-encoder state_dict (biencoder_wiki_large.bin), read with weights_only",
    )
    parser.add_argument(
        "--base-model", help="local HF directory with the BERT config and vocabulary"
    )
    parser.add_argument("--entities", help="BLINK entity.jsonl")
    parser.add_argument("--knowledge-source", help="kilt_knowledgesource.json")
    parser.add_argument(
        "--encodings",
        help="BLINK's all_entities_large.t7 (rows = entity.jsonl rows): index version 0 "
        "without re-encoding (dual scorer only)",
    )
    parser.add_argument(
        "--aida", nargs="+", help="aidayago2-{train,dev,test_without_answers}-kilt.jsonl"
    )


def input_overrides(args: argparse.Namespace) -> list[str]:
    """The ``--set blink.<key>=...`` equivalents of the input flags given."""
    overrides = [
        f"blink.{key}={getattr(args, flag)}"
        for flag, key in INPUT_FLAGS.items()
        if getattr(args, flag) is not None
    ]
    if args.aida:
        overrides.append("blink.aida=[" + ", ".join(f'"{path}"' for path in args.aida) + "]")
    return overrides


def run(args: argparse.Namespace) -> int:
    config = load_recipe(args, *input_overrides(args))
    from hnce.pipeline.blink_finetune.recipe import finetune_blink

    report = finetune_blink(config)
    print("\n".join(report.lines()))
    print(f"report: {report.run_dir / 'finetune_report.json'}")
    return 0
