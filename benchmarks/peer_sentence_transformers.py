"""Against the peer: sentence-transformers (``mine_hard_negatives`` once + MultipleNegativesRankingLoss)
vs ``hnce train`` with the demo recipe as shipped, same data, model, budget and cores, over
several seeds.

Both start from the packaged all-MiniLM-L6-v2 (local path, nothing downloaded) on the demo's
WordNet subset (``hnce.pipeline.demo.demo_dataset``: configs/demo.yaml's lemma-disjoint train /
held-out split and catalogue, cut once). hnce trains as configs/demo.yaml says (60 steps × 8
mentions, K = 8, mixed-50, cosine at temperature 0.05, negatives version 0 mined with the
starting model, the asynchronous refresh beside training, ``training.cores: auto``). The peer
trains on the very mentions hnce trained on with the same seed (read from hnce's step events),
60 steps × 8, each with 8 negatives mined once by ``mine_hard_negatives`` over the same catalogue,
on 2 torch threads. Both see the same token sequences: the peer's texts are hnce's
BLINK-formatted token ids decoded, with the markers registered in its tokenizer. Seed s is
hnce's ``run.seed`` (data order, negative draws, dropout) and the peer trainer's seed.

Evaluation is one code path for every model (:func:`benchmarks.peer.evaluation.exact_recall`):
hnce's ``BiEncoder`` embeds the held-out mentions and the whole catalogue, scores are exact,
recall from ``hnce.pipeline.metrics``. The peer's saved model loads as a ``BiEncoder`` with its
declared (mean) pooling and its vectors are L2-normalised, as its Normalize module and cosine
loss use them. With ``--check-product`` seed 0's final hnce checkpoint is also evaluated through
the product's path (``evaluate_export``: encoder actors + FAISS) as a check that the exact path
measures the same thing. Each seed's methods are kept in ``<work>/seed-<s>/state.json`` and not
trained again, so an interrupted run resumes method by method (``--work`` a kept directory).
The two training steps side by side on one batch: :mod:`benchmarks.step_parity`. The parts:
:mod:`benchmarks.peer`.

    .venv/bin/pip install -c constraints.txt -e '.[bench]'
    .venv/bin/python -m benchmarks.peer_sentence_transformers --seeds 3
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from benchmarks import harness
from benchmarks.peer.curves import SeedRuns
from benchmarks.peer.evaluation import dual_encoder, held_out_set, recall_untrained
from benchmarks.peer.hnce_training import DEMO, Setup, check_checkpoints, hnce_run, shared_recipe
from benchmarks.peer.peer_training import peer_run, require_bench_extra
from benchmarks.peer.report import write_raw, write_results
from hnce.encoders.biencoder import minilm_path
from hnce.pipeline.config import load_config
from hnce.pipeline.demo import demo_dataset
from hnce.progress import quiet


def parse_args() -> argparse.Namespace:
    """The command line: checkpoint steps, seeds, the product-path check, work directory,
    recipe overrides and the result file."""
    parser = harness.arguments(__doc__, "peer_sentence_transformers", work_dir=None, seeds=3)
    parser.add_argument("--checkpoints", default="30,60")
    parser.add_argument(
        "--check-product",
        action="store_true",
        help="also evaluate seed 0's final hnce export through evaluate_export (actors + FAISS)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        help="hnce recipe overrides (the result file names them; give it its own --output)",
    )
    return harness.parse(parser)


@quiet()  # no progress bars from hnce in this process
def main() -> None:
    """Measure both methods seed by seed (finished ones read back from each seed's state
    file), then write the results."""
    args = parse_args()
    require_bench_extra()
    checkpoints = [int(step) for step in args.checkpoints.split(",")]
    torch.set_num_threads(2)
    timer = harness.Timer()
    with tempfile.TemporaryDirectory(prefix="hnce-peer-") as scratch:
        work = Path(args.work_dir or scratch)
        config, counts = demo_dataset(load_config(DEMO, shared_recipe(work, checkpoints, args.set)))
        check_checkpoints(checkpoints, config.training.checkpoint_every)
        held_out = held_out_set(config)
        untrained = dual_encoder(minilm_path(), config)
        untrained_recall = recall_untrained(untrained, held_out)
        print("untrained", untrained_recall, flush=True)
        seeds = []
        for seed in range(args.seeds):
            seed_work = work / f"seed-{seed}"
            recipe = shared_recipe(seed_work, checkpoints, [*args.set, f"run.seed={seed}"])
            seed_config = load_config(DEMO, [*recipe, f"data.root={config.data.root}"])
            state = harness.StageState(seed_work / "state.json").load()
            setup = Setup(seed_work, state, recipe, seed_config, checkpoints, held_out)
            hnce = hnce_run(setup, args.check_product and seed == 0)
            seeds.append(SeedRuns(seed, hnce, peer_run(setup, hnce.trained, untrained)))
    total = timer.elapsed()
    write_raw(args.output.with_suffix(".json"), untrained_recall, seeds)
    write_results(args.output, counts, untrained_recall, seeds, total, args.set)


if __name__ == "__main__":
    main()
