"""Refresh encode throughput: the Ray encoder pool vs a bare `model(**batch)` loop, and
length-bucketed vs fixed-padding batches, on real WordNet definitions with all-MiniLM-L6-v2
(docs/engines.md).

The bare loop gets the same model, the same length-sorted batches read from the catalogue's token
store and the same torch thread count as the pool's actor; the pool's time includes reading the
token rows, Ray scheduling, building each shard's FAISS index and writing it (actor start-up and
model loading, once per refresh, and building the token store, once per tokenizer, are reported
apart).

    .venv/bin/python -m benchmarks.cluster_encode    # writes benchmarks/results/cluster_encode.md
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import numpy as np
import ray
import torch

from benchmarks import harness
from hnce.cluster.compute.encoder_actor import ShardTask
from hnce.cluster.compute.encoder_pool import EncoderPool, EncoderPoolSettings
from hnce.cluster.compute.entity_encoding import encode_entities
from hnce.cluster.compute.index_build import IndexedModel, ensure_token_store
from hnce.cluster.stores.index_spec import IndexSpec
from hnce.cluster.stores.tables import Entity
from hnce.cluster.stores.tables_write import write_dataset
from hnce.cluster.stores.tokens import TokenStore
from hnce.encoders.biencoder import (
    BiEncoder,
    build_biencoder,
    export_biencoder,
    load_biencoder,
    minilm_path,
)
from hnce.encoders.formatting import length_sorted_batches
from hnce.pipeline.data.wordnet import parse_data_line
from hnce.progress import quiet

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
def bare_loop(model: BiEncoder, batches: list[dict[str, torch.Tensor]]) -> None:
    """`model.entity_tower(**batch)` over the batches."""
    for batch in batches:
        model.entity_tower(**batch)


def parse_arguments() -> argparse.Namespace:
    """The command line: catalogue size, batching, threads, repeats and the result file."""
    sizes = {"entities": 2048, "batch_size": 64, "shard_size": 512, "threads": 1, "repeats": 3}
    parser = harness.arguments(__doc__, "cluster_encode", **sizes)
    return harness.parse(parser)


def build_catalogue(workdir: Path, count: int) -> tuple[Path, BiEncoder, TokenStore, float]:
    """Export MiniLM and write `count` WordNet entities under `workdir`, then build their token
    store: (export directory, the loaded model, the token store, seconds the store took)."""
    export_dir = workdir / "export"
    export_biencoder(build_biencoder(minilm_path(), "dual"), export_dir)
    entities = wordnet_entities(count)
    write_dataset(
        workdir / "data",
        (Entity(i, f"n{i}", title, text) for i, (title, text) in enumerate(entities)),
    )
    model = load_biencoder(export_dir).eval()
    tokens, seconds = harness.timed(
        lambda: ensure_token_store(workdir / "data", IndexedModel.from_export(export_dir))
    )
    return export_dir, model, tokens, seconds


def bare_loop_batches(
    tokens: TokenStore, bounds: list[tuple[int, int]], batch_size: int
) -> list[dict[str, torch.Tensor]]:
    """The pool's inputs for the bare loop: each shard's rows in its length-sorted batches."""
    batches = []
    for start, stop in bounds:
        ids = np.arange(start, stop)
        for rows in length_sorted_batches(tokens.lengths[ids], batch_size):
            batches.append(tokens.batch(ids[rows]))
    return batches


def timed_encode(
    model: BiEncoder, tokens: TokenStore, count: int, batch_size: int, bucketed: bool
) -> tuple[float, int]:
    """Seconds and padded tokens of `encode_entities` over the whole catalogue."""
    all_ids = np.arange(count)
    (_, _, padded_tokens), seconds = harness.timed(
        lambda: encode_entities(model, tokens, all_ids, batch_size, bucketed)
    )
    return seconds, padded_tokens


def start_pool(
    export_dir: Path, tokens: TokenStore, args: argparse.Namespace
) -> tuple[EncoderPool, float]:
    """Ray and a one-actor encoder pool; the pool and its start-up seconds (model load included)."""
    ray.init(num_cpus=max(2, args.threads), include_dashboard=False, log_to_driver=False)
    settings = EncoderPoolSettings(
        num_encoders=1, batch_size=args.batch_size, num_threads=args.threads
    )
    return harness.timed(lambda: EncoderPool(export_dir, settings, tokens.directory))


def shard_tasks(directory: Path, bounds: list[tuple[int, int]]) -> list[ShardTask]:
    """One pool task per shard of `bounds`, each writing its FAISS shard under `directory`."""
    directory.mkdir()
    return [
        ShardTask(number, entity_range, str(directory), IndexSpec(), 1)
        for number, entity_range in enumerate(bounds)
    ]


def best_alternated_seconds(
    model: BiEncoder,
    bare_batches: list[dict[str, torch.Tensor]],
    pool: EncoderPool,
    tasks: list[ShardTask],
    repeats: int,
) -> dict[str, float]:
    """Best seconds of the bare loop and of the pool over every shard, after a warm-up of each."""
    pool.index_shards(tasks[:1], lambda _: None)  # warm-up shard
    bare_loop(model, bare_batches[:2])
    # Alternate the two on a shared, noisy machine and keep the best of each.
    return harness.alternated_best(
        {
            "bare": lambda: bare_loop(model, bare_batches),
            "pool": lambda: pool.index_shards(tasks, lambda _: None),
        },
        repeats,
    )


def write_results(args: argparse.Namespace, m: dict[str, float]) -> None:
    """The result table of one run (``m``: seconds and token counts by name)."""
    count = args.entities
    rows = [
        ("entities (WordNet noun synsets, lemmas + definition)", f"{count}"),
        ("model", "all-MiniLM-L6-v2 entity tower, dual scorer, max 128 tokens"),
        ("torch threads (bare loop and actor)", str(args.threads)),
        ("timing", f"best of {args.repeats}, bare loop and pool alternated"),
        ("bare `entity_tower(**batch)` loop", f"{count / m['bare']:.1f} entities/s"),
        (
            "encoder pool (1 actor, token rows + encode + FAISS shard written)",
            f"{count / m['pool']:.1f} entities/s",
        ),
        ("pool / bare throughput", f"{m['bare'] / m['pool']:.3f}"),
        ("actor start-up + model load (once per refresh)", f"{m['startup']:.1f} s"),
        ("token store build (once per tokenizer and length)", f"{m['tokens']:.1f} s"),
        (
            "length-bucketed batches",
            f"{count / m['bucketed']:.1f} entities/s, {m['bucketed tokens']} padded tokens",
        ),
        (
            "fixed padding to 128",
            f"{count / m['fixed']:.1f} entities/s, {m['fixed tokens']} padded tokens",
        ),
        ("bucketed / fixed throughput", f"{m['fixed'] / m['bucketed']:.2f}×"),
        ("real (unpadded) tokens", str(m["real tokens"])),
    ]
    harness.write_measures(
        args.output,
        "Refresh encode throughput (benchmarks/cluster_encode.py)",
        "CPU only, one run; the machine is shared, so compare the ratios.",
        rows,
    )


@quiet()  # no progress bars from hnce in this process
def main() -> None:
    args = parse_arguments()
    torch.set_num_threads(args.threads)
    workdir = Path(tempfile.mkdtemp(prefix="hnce-encode-"))
    m: dict[str, float] = {}
    export_dir, model, tokens, m["tokens"] = build_catalogue(workdir, args.entities)
    bounds = [
        (start, min(start + args.shard_size, args.entities))
        for start in range(0, args.entities, args.shard_size)
    ]
    bare_batches = bare_loop_batches(tokens, bounds, args.batch_size)
    m["bucketed"], m["bucketed tokens"] = timed_encode(
        model, tokens, args.entities, args.batch_size, True
    )
    m["fixed"], m["fixed tokens"] = timed_encode(
        model, tokens, args.entities, args.batch_size, False
    )
    m["real tokens"] = int(sum(int(b["attention_mask"].sum()) for b in bare_batches))
    pool, m["startup"] = start_pool(export_dir, tokens, args)
    tasks = shard_tasks(workdir / "shards", bounds)
    m |= best_alternated_seconds(model, bare_batches, pool, tasks, args.repeats)
    pool.shutdown()
    ray.shutdown()
    shutil.rmtree(workdir)  # the export, catalogue and shards: ~175 MB at the default size
    write_results(args, m)


if __name__ == "__main__":
    main()
