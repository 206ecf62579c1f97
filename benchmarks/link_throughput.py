"""Linking throughput of `hnce.EntityLinker` (what `hnce link` runs): mentions per second and
latency per mention, cold (a new linker: Ray started, model read, index version found) and warm
(the same linker called again), at a small size.

The catalogue is a seeded synthetic dataset, the model the packaged all-MiniLM-L6-v2 exported as
a dual bi-encoder (untrained: throughput does not depend on training), searched through one
encoder actor in an index version built once by the first call and found again by every later
one. A warm call still starts its encoder pool and loads the index shards into it, since
`retrieve` holds them for one call; the table shows that part of each call apart.

    nice -n 10 .venv/bin/python -m benchmarks.link_throughput   # benchmarks/results/link_throughput.md
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import harness
from hnce.cluster.stores.tables import mention_split_path
from hnce.cluster.stores.tables_read import MentionSplit
from hnce.encoders.biencoder import build_biencoder, export_biencoder, minilm_path
from hnce.pipeline.config import Config, load_config
from hnce.pipeline.data.synthetic import generate_synthetic_dataset
from hnce.pipeline.link import EntityLinker, marked_mentions
from hnce.progress import quiet

WORLDS = 4  # synthetic worlds: the last one's mentions are the test split


def parse_arguments() -> argparse.Namespace:
    """Sizes (catalogue, mentions per call, k), repeats and the work directory."""
    parser = harness.arguments(
        __doc__, "link_throughput", work_dir=None, entities=1000, queries=200, k=8, repeats=3
    )
    return harness.parse(parser)


def prepare(work: Path, args: argparse.Namespace) -> tuple[Config, Path, list[str]]:
    """The dataset, the exported model and the marked texts: (recipe, export, texts)."""
    data, export = work / "data", work / "export"
    per_world = max(1, args.entities // WORLDS)
    if not data.exists():
        generate_synthetic_dataset(data, WORLDS, per_world, -(-args.queries // per_world), seed=0)
    if not export.exists():
        export_biencoder(build_biencoder(minilm_path(), "dual"), export)
    config = load_config(
        None,
        [
            f"run.dir={work / 'run'}",
            f"data.root={data}",
            "refresh.num_encoders=1",
            "refresh.encoder_cpus=1",
        ],
    )
    mentions = MentionSplit.open(mention_split_path(data, "test")).read_all()[: args.queries]
    texts = [
        f"{m.context_left} [START_ENT] {m.mention} [END_ENT] {m.context_right}" for m in mentions
    ]
    return config, export, texts


def cold_call(config: Config, export: Path, texts: list[str], k: int) -> float:
    """Seconds of a new linker's first call (Ray started by it; stopping Ray not counted)."""
    timer = harness.Timer()
    with EntityLinker.from_config(config, export=export) as linker:
        linker.link(texts, k)
        return timer.stop()


def measure(
    config: Config, export: Path, texts: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    """Seconds of each measure (best of the repeats where repeated) and a warm call's stages."""
    m: dict[str, Any] = {"build": cold_call(config, export, texts, args.k)}  # encodes the catalogue
    m["cold"] = min(cold_call(config, export, texts, args.k) for _ in range(args.repeats))
    with EntityLinker.from_config(config, export=export) as linker:
        linker.link(texts[:1], args.k)  # Ray started: every later call is warm
        m["warm"] = harness.best_of(lambda: linker.link(texts, args.k), args.repeats)
        m["one"] = harness.best_of(lambda: linker.link(texts[:1], args.k), args.repeats)
        m["stages"] = linker.search(marked_mentions(texts[0], "text 1"), args.k).seconds
        linker.encode_mentions(texts[:1])  # loads the model into this process
        m["local"] = harness.best_of(lambda: linker.encode_mentions(texts), args.repeats)
        m["entities"] = len(linker.catalogue)
    return m


def write_results(args: argparse.Namespace, count: int, m: dict[str, Any]) -> None:
    """The result table."""
    stages = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in m["stages"].items())
    rows = [
        ("catalogue", f"{m['entities']:,} synthetic entities (max 64 tokens)"),
        ("model", "all-MiniLM-L6-v2, dual, exported untrained; 1 encoder actor, 1 CPU"),
        ("mentions per call, k", f"{count}, {args.k}"),
        ("first call (Ray start, catalogue encoded into an index)", f"{m['build']:.1f} s"),
        (
            "cold: new linker, Ray started, index found",
            f"{count / m['cold']:.1f} mentions/s ({m['cold']:.1f} s)",
        ),
        (
            "warm: the same linker again",
            f"{count / m['warm']:.1f} mentions/s ({m['warm']:.1f} s)",
        ),
        ("warm latency per mention", f"{1000 * m['warm'] / count:.1f} ms"),
        ("warm call of one mention", f"{m['one']:.2f} s"),
        ("stages of a warm one-mention call", stages),
        (
            "mention tower alone, in-process (encode_mentions)",
            f"{count / m['local']:.1f} mentions/s",
        ),
    ]
    harness.write_measures(
        args.output,
        "Linking throughput: `hnce link` / EntityLinker (benchmarks/link_throughput.py)",
        f"CPU only, best of {args.repeats} where repeated; the machine is shared, so compare "
        "cold and warm within the run.",
        rows,
    )


@quiet()  # no progress bars from hnce in this process
def main() -> None:
    args = parse_arguments()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="hnce-link-"))
    config, export, texts = prepare(work, args)
    write_results(args, len(texts), measure(config, export, texts, args))


if __name__ == "__main__":
    main()
