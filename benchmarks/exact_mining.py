"""Throughput of exact mining for the scorers whose query depends on the entity (poly-m, genpoly-m).

One shard holder's work (`hnce.cluster.stores.exact_search.ExactSearcher`) on one CPU thread: a batch of
mentions' reduced vectors (poly-16: 16 code vectors each) scored against every stored entity
(poly: one vector each; genpoly-16-4: four) with the scorer's own ``score_reduced``, in chunks,
top-k kept. Reported: mention-entity pairs per second, and from it the hours one holder needs to
mine ``--mentions`` training mentions over catalogues of several sizes (holders divide it).

    .venv/bin/python -m benchmarks.exact_mining [--entities 20000] [--dim 384]

writes ``benchmarks/results/exact_mining.md``.
"""

from __future__ import annotations

import faiss
import torch

from benchmarks import harness
from hnce.cluster.stores.exact_search import ExactSearcher
from hnce.cluster.stores.faiss_device import resolve_faiss_device
from hnce.cluster.stores.index_shard import IndexShard
from hnce.encoders.scorers import build_scorer

SCORERS = ("poly-16", "genpoly-16-4")
CATALOGUES = (10_000, 100_000, 1_000_000, 5_903_530)


def pairs_per_second(spec: str, entities: int, dim: int, mentions: int, k: int, seed: int) -> float:
    """Mention-entity pairs scored per second by one exact searcher over `entities` entities."""
    torch.manual_seed(seed)
    scorer = build_scorer(spec, dim)
    hidden = torch.randn(entities, 8, dim)
    with torch.inference_mode():
        vectors, owners = scorer.entity_index_vectors(hidden, torch.ones(entities, 8))
        queries = scorer.mention_query_vectors(
            torch.randn(mentions, 32, dim), torch.ones(mentions, 32)
        ).numpy()
    index = faiss.IndexFlatIP(dim)
    index.add(vectors.numpy())
    shard = IndexShard.on_device(index, owners.numpy(), resolve_faiss_device("cpu"))
    searcher = ExactSearcher([shard], scorer, torch.device("cpu"))
    searcher.search(queries[:8], k)  # warm-up
    return mentions * entities / harness.timed(lambda: searcher.search(queries, k))[1]


def main() -> int:
    parser = harness.arguments(__doc__, "exact_mining", entities=20_000, k=64, seed=0)
    parser.add_argument("--dim", type=int, default=384, help="384: all-MiniLM-L6-v2")
    parser.add_argument("--batch", type=int, default=256, help="mentions per search")
    parser.add_argument("--mentions", type=int, default=10_000, help="training mentions mined")
    args = harness.parse(parser)
    torch.set_num_threads(1)
    lines = [
        "# Exact mining throughput (poly-m, genpoly-m)",
        "",
        f"One shard holder, one CPU thread: {args.batch} mentions against {args.entities:,} "
        f"stored entities, d = {args.dim}, top-{args.k} (`hnce.cluster.stores.exact_search`). Command: "
        "`.venv/bin/python -m benchmarks.exact_mining`.",
        "",
        "| scorer | pairs/s | "
        + " | ".join(f"{n:,} entities x {args.mentions:,} mentions" for n in CATALOGUES)
        + " |",
        "|---|---|" + "---|" * len(CATALOGUES),
    ]
    for spec in SCORERS:
        rate = pairs_per_second(spec, args.entities, args.dim, args.batch, args.k, args.seed)
        hours = [f"{n * args.mentions / rate / 3600:.2g} h" for n in CATALOGUES]
        lines.append(f"| {spec} | {rate:.3g} | " + " | ".join(hours) + " |")
    harness.write_result(args.output, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
