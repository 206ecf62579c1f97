"""``hnce rerank``: train the joint cross-encoder on a fixed retriever's top candidates and report
normalized / unnormalized accuracy per domain and macro-averaged (paper Table 2, App. B).

Settings: the ``rerank`` section of the run's recipe (candidates from the run's negatives store or
from a retriever checkpoint; ``training`` but for what ``rerank.training`` sets);
``data.train_split``.
Training runs through the same driver as ``hnce train`` (DeepSpeed under Ray Train) in
``<run.dir>/rerank`` and resumes from its newest checkpoint when run again. ``--denoise`` then
flags the train candidates the reranker scores within ``rerank.denoise_margin`` of the gold
(RocketQA) into ``<run.dir>/rerank/false_negatives.json``, which a retriever recipe with
``negatives.candidates.denoised: true`` never draws as negatives.
"""

from __future__ import annotations

import argparse

from hnce.pipeline.cli._common import add_config_arguments, load_recipe


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument(
        "--denoise",
        action="store_true",
        help="also write the train candidates the reranker flags as false negatives "
        "(rerank.denoise_margin; read by negatives.candidates.denoised)",
    )


def run(args: argparse.Namespace) -> int:
    config = load_recipe(args)
    from hnce.pipeline.rerank import format_reports
    from hnce.pipeline.rerank_job import run_rerank_job

    reports, summary, out = run_rerank_job(config, args.denoise)
    print(
        f"{summary.line()}; {summary.mentions} training mentions "
        f"({summary.skipped_missing_gold} without a gold in the catalogue left out)"
    )
    print(format_reports(reports))
    print(f"reranker: {out / 'reranker'}; report: {out / 'rerank_report.json'}")
    if args.denoise:
        print(f"false negatives: {out / 'false_negatives.json'}")
    return 0
