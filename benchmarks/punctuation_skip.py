"""Sum-of-max with and without the entity's punctuation tokens: what skipping them saves in token
vectors, and what it costs in recall (``model.scorer.skip_punctuation``, ColBERT's skiplist).

The demo's WordNet subset (configs/demo.yaml: its catalogue and its held-out mentions, whose lemmas
training never saw), each model as a sum-of-max ``BiEncoder`` with cosine token vectors (as the
demo scores, ColBERT's normalised vectors), once keeping every entity token and once skipping the
punctuation. Every held-out mention is scored exactly against the whole catalogue
(``index_scores``: Σ_i max_j over the stored token vectors), so the figures are the scorer's, not
an index's. Per model and setting: token vectors stored per entity, R@1/8/64 of the golds, and
the share of the every-token top-100 that the skipping top-100 keeps. Models: the packaged MiniLM
as it starts training, and each ``--export`` (a bi-encoder export, e.g. a trained som
checkpoint's ``export/``).

    .venv/bin/python -m benchmarks.punctuation_skip
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch

from benchmarks import harness
from benchmarks.peer.evaluation import (
    HeldOut,
    catalogue_vectors,
    held_out_set,
    recall_of_candidates,
)
from benchmarks.peer.hnce_training import DEMO
from hnce.encoders.biencoder import BiEncoder, build_biencoder, load_biencoder, minilm_path
from hnce.encoders.scorers import ScorerConfig, build_scorer, index_scores
from hnce.pipeline.config import Config, load_config
from hnce.pipeline.demo import demo_dataset
from hnce.progress import quiet

TOP = 100
MENTIONS_PER_CHUNK = 32


def parse_args() -> argparse.Namespace:
    parser = harness.arguments(__doc__, "punctuation_skip", work_dir=None)
    parser.add_argument("--export", type=Path, action="append", default=[])
    return harness.parse(parser)


def starting_model(source: Path, config: Config) -> BiEncoder:
    """A bi-encoder export as it was saved, or the packaged model at the recipe's lengths."""
    if (source / "scorer.json").is_file():
        return load_biencoder(source)
    return build_biencoder(
        source,
        "som",
        mention_length=config.model.mention_length,
        entity_length=config.model.entity_length,
    )


def som_model(base: BiEncoder, skip: bool) -> BiEncoder:
    """``base``'s towers under a cosine sum-of-max scorer, skipping punctuation or not."""
    return BiEncoder(
        base.mention_tower,
        base.entity_tower,
        build_scorer(ScorerConfig(name="som", skip_punctuation=skip), base.output_size),
        base.tokenizer,
        base.mention_length,
        base.entity_length,
        base.mention_projection,
        base.entity_projection,
        base.pooling,
        normalize=True,
    ).eval()


def top_entities(model: BiEncoder, held_out: HeldOut) -> tuple[np.ndarray, float]:
    """Each held-out mention's exact sum-of-max top-``TOP`` entity ids, and the token vectors
    stored per entity."""
    vectors, owners = catalogue_vectors(model, held_out)
    mentions = held_out.mentions
    tops = []
    with torch.inference_mode():
        for start in range(0, len(mentions), MENTIONS_PER_CHUNK):
            chunk = mentions[start : start + MENTIONS_PER_CHUNK]
            tokens = model.tokenize_mentions(
                [m.context_left for m in chunk],
                [m.mention for m in chunk],
                [m.context_right for m in chunk],
            )
            scores = index_scores(
                model.mention_query_vectors(**tokens), vectors, owners, len(held_out.texts)
            )
            tops.append(scores.topk(TOP, dim=1).indices.numpy())
    return np.concatenate(tops), len(vectors) / len(held_out.texts)


def kept_share(full: np.ndarray, skipped: np.ndarray) -> float:
    """Mean share of each mention's every-token top-``TOP`` found in its skipping top-``TOP``."""
    return float(
        np.mean([len(np.intersect1d(a, b)) / TOP for a, b in zip(full, skipped, strict=True)])
    )


@quiet()
def main() -> None:
    args = parse_args()
    torch.set_num_threads(2)
    timer = harness.Timer()
    with tempfile.TemporaryDirectory(prefix="hnce-punctuation-") as scratch:
        work = Path(args.work_dir or scratch)
        config, _ = demo_dataset(load_config(DEMO, [f"run.dir={work}"]))
        held_out = held_out_set(config)
        rows = []
        for name, source in [
            ("MiniLM, untrained", minilm_path()),
            *((str(e), e) for e in args.export),
        ]:
            base = starting_model(source, config)
            full, full_tokens = top_entities(som_model(base, False), held_out)
            skipped, skipped_tokens = top_entities(som_model(base, True), held_out)
            for setting, top, tokens in (
                ("every token", full, full_tokens),
                ("punctuation skipped", skipped, skipped_tokens),
            ):
                found = recall_of_candidates(top, held_out)
                share = "1.000" if top is full else f"{kept_share(full, top):.3f}"
                rows.append(
                    f"| {name} | {setting} | {tokens:.1f} | "
                    + " | ".join(f"{found[k]:.3f}" for k in (1, 8, 64))
                    + f" | {share} |"
                )
            print(rows[-2], rows[-1], sep="\n", flush=True)
    lines = [
        "# Sum-of-max with and without punctuation tokens (benchmarks/punctuation_skip.py)",
        "",
        f"The demo's WordNet subset: {len(held_out.mentions)} held-out mentions (lemmas training "
        f"never saw) against all {len(held_out.texts):,} catalogue synsets, exact sum-of-max over "
        "cosine token vectors (every mention token; the entity's tokens all, or without the "
        "single-character ASCII punctuation tokens, `model.scorer.skip_punctuation`). "
        f"Top-{TOP} kept: the share of the every-token top-{TOP} that the skipping top-{TOP} holds. "
        f"{timer.elapsed() / 60:.1f} min on 2 cores. Command: "
        f"`{harness.invocation('benchmarks.punctuation_skip')}`.",
        "",
        f"| model | entity tokens | token vectors per entity | R@1 | R@8 | R@64 | top-{TOP} kept |",
        "|---|---|---:|---:|---:|---:|---:|",
        *rows,
    ]
    harness.write_result(args.output, lines)


if __name__ == "__main__":
    main()
