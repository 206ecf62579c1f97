"""``hnce rerank``: train the joint cross-encoder on a fixed retriever's top-63 negatives and
report normalized / unnormalized accuracy per domain and macro-averaged (paper Table 2, App. B)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", type=Path, required=True, help="dataset directory (Parquet)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--negatives",
        type=Path,
        help="negatives store (<run>/negatives): candidates = newest version's top-N per split",
    )
    source.add_argument(
        "--retriever", type=Path, help="bi-encoder export directory (checkpoints/step-S/export)"
    )
    parser.add_argument(
        "--index",
        type=Path,
        default=None,
        help="with --retriever: index store (<run>/index) built by it; default: encode the "
        "whole catalogue now into an exact index",
    )
    parser.add_argument(
        "--model", default="minilm", help="reranker's initial BERT: a local HF dir or 'minilm'"
    )
    parser.add_argument("--out", type=Path, default=Path("runs/rerank"))
    parser.add_argument("--train-split", default="train")
    parser.add_argument("--eval-splits", nargs="+", default=["dev", "test"])
    parser.add_argument("--num-candidates", type=int, default=64, help="gold + top-(N-1)")
    parser.add_argument("--mention-length", type=int, default=32)
    parser.add_argument("--entity-length", type=int, default=128)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=2, help="mentions per micro-batch")
    parser.add_argument("--gradient-accumulation", type=int, default=1)
    parser.add_argument("--learning-rate", type=float, default=2e-5)
    parser.add_argument("--warmup-steps", type=int, default=100)
    parser.add_argument("--zero-stage", type=int, default=0, choices=[0, 1, 2, 3])
    parser.add_argument("--max-train-mentions", type=int, default=0, help="0 = all")
    parser.add_argument("--max-eval-mentions", type=int, default=0, help="0 = all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    from pipeline.config import TrainingSettings
    from pipeline.rerank import RerankJob, format_reports, run_rerank_job

    if args.index is not None and args.retriever is None:
        print("hnce rerank: --index needs --retriever", file=sys.stderr)
        return 2
    job = RerankJob(
        data_root=args.data,
        out=args.out,
        model_path=args.model,
        negatives_root=args.negatives,
        retriever=args.retriever,
        index_root=args.index,
        train_split=args.train_split,
        eval_splits=tuple(args.eval_splits),
        num_candidates=args.num_candidates,
        mention_length=args.mention_length,
        entity_length=args.entity_length,
        max_train_mentions=args.max_train_mentions,
        max_eval_mentions=args.max_eval_mentions,
        seed=args.seed,
        training=TrainingSettings(
            steps=args.steps,
            batch_size=args.batch_size,
            gradient_accumulation=args.gradient_accumulation,
            learning_rate=args.learning_rate,
            warmup_steps=args.warmup_steps,
            zero_stage=args.zero_stage,
            num_workers=1,
        ),
    )
    reports, log = run_rerank_job(job, progress=not args.no_progress)
    print(
        f"trained on {log.train_mentions} mentions ({log.skipped_missing_gold} without a gold in "
        f"the catalogue skipped), final loss {log.losses[-1]:.4f}"
    )
    print(format_reports(reports))
    print(f"reranker: {args.out / 'reranker'}; report: {args.out / 'rerank_report.json'}")
    return 0
