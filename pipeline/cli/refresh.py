"""`hnce refresh`: re-encode the catalogue into a new index version and mine negatives (DESIGN.md §5).

One shot (cron, `ray job submit`) or `--every 6h`. Exit codes: 0 done (or already up to date),
3 no complete checkpoint, 75 another refresh of the run holds the lock; errors raise (exit 1).
The logic lives in `cluster.refresh` and `cluster.refresh_job`.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run-dir", type=Path, required=True, help="run with checkpoints/")
    parser.add_argument(
        "--data", type=Path, required=True, help="dataset dir (entities/, mentions/)"
    )
    parser.add_argument("--step", type=int, help="checkpoint step (default: newest complete)")
    parser.add_argument("--every", help="repeat at this interval, e.g. 6h, 30m (default: once)")
    parser.add_argument("--splits", default="train", help="comma-separated splits to mine")
    parser.add_argument("--top-n", type=int, default=64, help="candidates kept per mention")
    parser.add_argument(
        "--num-encoders", type=int, default=0, help="0 = one per encoder slot / GPU, else 1"
    )
    parser.add_argument("--encoder-threads", type=int, default=1, help="torch threads per actor")
    parser.add_argument("--batch-size", type=int, default=64, help="entities per forward pass")
    parser.add_argument("--shard-size", type=int, default=100_000, help="entities per shard")
    parser.add_argument(
        "--index",
        choices=("flat", "ivfpq", "hnsw"),
        default="flat",
        help="shard index: flat (exact, for mining) or ivfpq / hnsw (approximate, for serving)",
    )
    parser.add_argument(
        "--faiss-device",
        choices=("auto", "cpu", "gpu"),
        default="auto",
        help="where shards are searched: auto = GPU (fp16 flat) when faiss-gpu sees one; "
        "gpu without one is an error",
    )
    parser.add_argument("--keep", type=int, default=3, help="versions retained per store")
    parser.add_argument("--address", default="local", help="Ray address, or 'local'")
    parser.add_argument("--num-cpus", type=int, default=0, help="local Ray CPUs (0 = all)")


def run(args: argparse.Namespace) -> int:
    from cluster.refresh import RefreshConfig
    from cluster.refresh_job import parse_interval, refresh_every, refresh_once
    from cluster.sharded_index import IndexSpec

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    config = RefreshConfig(
        run_dir=args.run_dir,
        data_dir=args.data,
        splits=tuple(split for split in args.splits.split(",") if split),
        num_encoders=args.num_encoders,
        encoder_threads=args.encoder_threads,
        batch_size=args.batch_size,
        shard_size=args.shard_size,
        top_n=args.top_n,
        index=IndexSpec(kind=args.index),
        faiss_device=args.faiss_device,
        keep=args.keep,
    )

    def connect() -> None:
        import ray

        if ray.is_initialized():
            return
        if args.address == "local":
            ray.init(num_cpus=args.num_cpus or None, include_dashboard=False)
        else:
            ray.init(address=args.address)

    if args.every is None:
        return refresh_once(config, args.step, connect=connect)
    return refresh_every(config, parse_interval(args.every), connect=connect)
