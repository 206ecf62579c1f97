"""``hnce eval``: recall@{1,8,64,100} and accuracy against the whole catalogue, macro over domains;
with ``--kilt-predictions``, KILT predictions for every input id of KILT files instead."""

from __future__ import annotations

import argparse
from pathlib import Path

from hnce.pipeline.cli._common import add_config_arguments, load_recipe


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument(
        "--checkpoint",
        default="newest",
        help="'newest' (the run's newest complete checkpoint), 'untrained' (model.path), "
        "or a checkpoint's step-<S>/ or export/ directory",
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON report (default: run dir)")
    parser.add_argument(
        "--kilt-predictions",
        nargs="+",
        type=Path,
        metavar="AIDA_FILE",
        help="instead of recall: KILT predictions for every input id of these KILT files "
        "(<run>/predictions/<file name>)",
    )


def run(args: argparse.Namespace) -> int:
    config = load_recipe(args)
    from hnce.pipeline.evaluate import evaluate_checkpoint, predict_checkpoint
    from hnce.pipeline.metrics import format_table, write_reports
    from hnce.pipeline.run import refuse_inside_stores

    if args.out is not None:
        refuse_inside_stores(args.out, config.run_dir, "--out")

    if args.kilt_predictions:
        files = predict_checkpoint(config, args.checkpoint, args.kilt_predictions)
        for result in files:
            accuracy = "" if result.after is None else f", accuracy {result.after.accuracy:.4f}"
            print(f"{result.file}: {result.inputs} predictions{accuracy} -> {result.predictions}")
        return 0
    report = evaluate_checkpoint(config, args.checkpoint)
    out = args.out or config.run_dir / f"eval-{config.data.eval_split}.json"
    write_reports([report], out)
    print(format_table([report], config.eval.ks))
    print(
        f"accuracy {report.accuracy:.4f} (macro over {len(report.per_domain)} domains "
        f"{report.macro_accuracy:.4f}); JSON: {out}"
    )
    return 0
