"""``hnce plan``: the memory a recipe needs per process (trainer worker, index shard holder).

Figures come from ``hnce.pipeline.plan`` (model states per ZeRO stage and world size, activations of
one micro-batch with the recipe's checkpointing and chunking, index vectors); nothing is loaded
but the models' configs.
"""

from __future__ import annotations

import argparse

from hnce.pipeline.cli._common import add_config_arguments, load_recipe


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument(
        "--task",
        choices=["retriever", "reranker"],
        default="retriever",
        help="what to plan: hnce train (retriever) or hnce rerank (reranker)",
    )
    parser.add_argument(
        "--entities",
        type=int,
        default=None,
        help="catalogue size for the index figures (default: the entities in data.root)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")


def run(args: argparse.Namespace) -> int:
    config = load_recipe(args)
    from hnce.pipeline.plan import catalogue_size, describe, plan_memory

    entities = args.entities if args.entities is not None else catalogue_size(config)
    if entities is None:
        raise config.error(
            "data.root", "holds no catalogue yet: pass --entities N to plan the index"
        )
    plan = plan_memory(config, args.task, entities)
    print(describe(plan) if args.json else plan.format())
    return 0
