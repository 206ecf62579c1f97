"""``hnce eval``: recall@{1,8,64,100} and accuracy against the whole catalogue, macro over domains."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.cli._common import add_config_arguments, config_from_args
from pipeline.config import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument(
        "--checkpoint",
        default="newest",
        help="'newest' (the run's newest complete checkpoint), 'untrained' (model.path), "
        "or a checkpoint's step-<S>/ or export/ directory",
    )
    parser.add_argument("--split", default=None, help="mention split (default: data.eval_split)")
    parser.add_argument("--out", type=Path, default=None, help="JSON report (default: run dir)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
    except ConfigError as error:
        print(f"hnce eval: {error}", file=sys.stderr)
        return 2
    from cluster.tables import EntityCatalogue, MentionSplit, mention_split_path
    from encoders.biencoder import load_biencoder
    from pipeline.evaluate import evaluate_model, format_table, write_reports
    from pipeline.train.checkpoints import EXPORT_DIR, newest_checkpoint
    from pipeline.train.model import build_model

    if args.checkpoint == "untrained":
        model, name = build_model(config), f"untrained {config.model.path}"
    else:
        if args.checkpoint == "newest":
            newest = newest_checkpoint(config.run_dir)
            if newest is None:
                print(f"hnce eval: no complete checkpoint in {config.run_dir}", file=sys.stderr)
                return 1
            path = newest[1]
        else:
            path = Path(args.checkpoint)
        export = path / EXPORT_DIR if (path / EXPORT_DIR).is_dir() else path
        model, name = load_biencoder(export), str(path)
    root = Path(config.data.root)
    split = args.split or config.data.eval_split
    mentions = MentionSplit.open(mention_split_path(root, split)).read_all()
    limit = config.data.max_eval_mentions
    mentions = mentions[:limit] if limit > 0 else mentions
    report = evaluate_model(
        name,
        model,
        EntityCatalogue.open(root),
        mentions,
        config.eval.ks,
        config.eval.batch_size,
        max_entities=config.eval.max_entities,
        num_shards=config.index.num_shards,
        per_domain_catalogue=config.eval.per_domain_catalogue,
        progress=not args.no_progress,
    )
    out = args.out or config.run_dir / f"eval-{split}.json"
    write_reports([report], out)
    print(format_table([report], config.eval.ks))
    print(
        f"accuracy {report.accuracy:.4f} (macro over {len(report.per_domain)} domains "
        f"{report.macro_accuracy:.4f}); JSON: {out}"
    )
    return 0
