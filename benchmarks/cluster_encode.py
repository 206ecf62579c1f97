"""Refresh encode throughput: the Ray encoder pool vs a bare `model(**batch)` loop, and
length-bucketed vs fixed-padding batches, on real WordNet definitions with all-MiniLM-L6-v2
(DESIGN.md §8).

The bare loop gets the same model, the same length-sorted batches read from the catalogue's token
store and the same torch thread count as the pool's actor; the pool's time includes reading the
token rows, Ray scheduling, building each shard's FAISS index and writing it (actor start-up and
model loading, once per refresh, and building the token store, once per tokenizer, are reported
apart).

    .venv/bin/python benchmarks/cluster_encode.py     # writes benchmarks/results/cluster_encode.md
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import ray
import torch
from report import write_measures

from cluster.encoder_pool import EncoderPool, EncoderPoolSettings, ShardTask, encode_entities
from cluster.index_build import IndexedModel, ensure_token_store
from cluster.sharded_index import IndexSpec
from cluster.tables import Entity, write_dataset
from encoders.biencoder import build_biencoder, export_biencoder, load_biencoder, minilm_path
from encoders.formatting import length_sorted_batches
from pipeline.data.wordnet import parse_data_line

RESULTS = Path(__file__).resolve().parent / "results"
WORDNET_NOUNS = Path("/usr/share/wordnet/data.noun")


def wordnet_entities(count: int) -> list[tuple[str, str]]:
    """(title, text) of `count` noun synsets spread evenly over the file."""
    lines = [
        line
        for line in WORDNET_NOUNS.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("  ")
    ]
    picked = np.linspace(0, len(lines) - 1, count).astype(int)
    synsets = [parse_data_line(lines[i], "n", "n") for i in picked]
    return [(synset.title, synset.text) for synset in synsets]


@torch.inference_mode()
def bare_loop(model, batches: list[dict[str, torch.Tensor]]) -> float:
    """Seconds for `model.entity_tower(**batch)` over the batches."""
    start = time.perf_counter()
    for batch in batches:
        model.entity_tower(**batch)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--shard-size", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", type=Path, default=RESULTS / "cluster_encode.md")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    workdir = Path(tempfile.mkdtemp(prefix="hnce-encode-"))
    export_dir = workdir / "export"
    export_biencoder(build_biencoder(minilm_path(), "dual"), export_dir)
    entities = wordnet_entities(args.entities)
    write_dataset(
        workdir / "data",
        (Entity(i, f"n{i}", title, text) for i, (title, text) in enumerate(entities)),
    )
    model = load_biencoder(export_dir).eval()
    tokens_started = time.perf_counter()
    tokens = ensure_token_store(workdir / "data", IndexedModel.from_export(export_dir), False)
    tokens_seconds = time.perf_counter() - tokens_started
    bounds = [
        (start, min(start + args.shard_size, len(entities)))
        for start in range(0, len(entities), args.shard_size)
    ]

    # Same inputs for the bare loop: the pool's shards, in its length-sorted batches.
    bare_batches = []
    for start, stop in bounds:
        ids = np.arange(start, stop)
        for rows in length_sorted_batches(tokens.lengths[ids], args.batch_size):
            bare_batches.append(tokens.batch(ids[rows]))
    all_ids = np.arange(len(entities))
    bucketed_seconds = time.perf_counter()
    _, _, bucketed_tokens = encode_entities(model, tokens, all_ids, args.batch_size, True)
    bucketed_seconds = time.perf_counter() - bucketed_seconds
    fixed_seconds = time.perf_counter()
    _, _, fixed_tokens = encode_entities(model, tokens, all_ids, args.batch_size, False)
    fixed_seconds = time.perf_counter() - fixed_seconds
    real_tokens = int(sum(int(b["attention_mask"].sum()) for b in bare_batches))

    ray.init(num_cpus=max(2, args.threads), include_dashboard=False, log_to_driver=False)
    startup = time.perf_counter()
    settings = EncoderPoolSettings(
        num_encoders=1, batch_size=args.batch_size, num_threads=args.threads
    )
    pool = EncoderPool(export_dir, settings, tokens.directory)
    startup = time.perf_counter() - startup
    shards = workdir / "shards"
    shards.mkdir()
    tasks = [
        ShardTask(number, entity_range, str(shards), IndexSpec(), 1)
        for number, entity_range in enumerate(bounds)
    ]
    pool.index_shards(tasks[:1], lambda _: None)  # warm-up shard
    bare_loop(model, bare_batches[:2])
    # Alternate the two on a shared, noisy machine and keep the best of each.
    bare_times, pool_times = [], []
    for _ in range(args.repeats):
        bare_times.append(bare_loop(model, bare_batches))
        started = time.perf_counter()
        pool.index_shards(tasks, lambda _: None)
        pool_times.append(time.perf_counter() - started)
    bare_seconds, pool_seconds = min(bare_times), min(pool_times)
    pool.shutdown()
    ray.shutdown()

    count = len(entities)
    rows = [
        ("entities (WordNet noun synsets, lemmas + definition)", f"{count}"),
        ("model", "all-MiniLM-L6-v2 entity tower, dual scorer, max 128 tokens"),
        ("torch threads (bare loop and actor)", str(args.threads)),
        ("timing", f"best of {args.repeats}, bare loop and pool alternated"),
        ("bare `entity_tower(**batch)` loop", f"{count / bare_seconds:.1f} entities/s"),
        (
            "encoder pool (1 actor, token rows + encode + FAISS shard written)",
            f"{count / pool_seconds:.1f} entities/s",
        ),
        ("pool / bare throughput", f"{bare_seconds / pool_seconds:.3f}"),
        ("actor start-up + model load (once per refresh)", f"{startup:.1f} s"),
        ("token store build (once per tokenizer and length)", f"{tokens_seconds:.1f} s"),
        (
            "length-bucketed batches",
            f"{count / bucketed_seconds:.1f} entities/s, {bucketed_tokens} padded tokens",
        ),
        (
            "fixed padding to 128",
            f"{count / fixed_seconds:.1f} entities/s, {fixed_tokens} padded tokens",
        ),
        ("bucketed / fixed throughput", f"{fixed_seconds / bucketed_seconds:.2f}×"),
        ("real (unpadded) tokens", str(real_tokens)),
    ]
    write_measures(
        args.output,
        "Refresh encode throughput (benchmarks/cluster_encode.py)",
        "CPU only, one run; the machine is shared, so compare the ratios.",
        rows,
    )


if __name__ == "__main__":
    main()
