"""Against the peer: sentence-transformers (``mine_hard_negatives`` once + MultipleNegativesRankingLoss)
vs ``hnce train`` (mixed-50 on the asynchronous refresh, shared negatives), same data, model,
budget and cores.

Both start from the packaged all-MiniLM-L6-v2 (local path, nothing downloaded) on the demo's
WordNet subset (``hnce.pipeline.demo.demo_dataset``: configs/demo.yaml's lemma-disjoint train /
held-out split and catalogue). hnce trains as the demo recipe does (60 steps × 8 mentions, K = 8,
1 trainer core + 1 refresh core). The peer trains on the very mentions hnce trained on (read from
hnce's step events), 60 steps × 8, each with 8 negatives mined once by ``mine_hard_negatives``
over the same catalogue, on 2 torch threads. Both see the same token sequences: the peer's texts
are hnce's BLINK-formatted token ids decoded, with the markers registered in its tokenizer.

Evaluation is one code path for every model (:func:`benchmarks.peer.evaluation.exact_recall`):
hnce's ``BiEncoder`` embeds the held-out mentions and the whole catalogue, scores are exact,
recall from ``hnce.pipeline.metrics``. The peer's saved model loads as a ``BiEncoder`` with its
declared (mean) pooling and its vectors are L2-normalised, as its Normalize module and cosine
loss use them. The hnce final checkpoint is also evaluated through the product's path
(``evaluate_export``: encoder actors + FAISS) as a check that the exact path measures the same
thing. ``--cosine`` also trains hnce with ``model.normalize: true``, the peer's temperature
(0.05, its scale 20) and negatives version 0 mined with the starting model
(``negatives.initial: model``) on the same mentions. Finally one hnce training step is profiled
(torch.profiler, in-process, 1 thread as in the run). Each method's curve is kept in
``<work>/state.json`` and not trained again, so an interrupted run resumes method by method
(``--work`` a kept directory). The parts: :mod:`benchmarks.peer`.

    .venv/bin/pip install -c constraints.txt -e '.[bench]'
    .venv/bin/python -m benchmarks.peer_sentence_transformers
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from benchmarks import harness
from benchmarks.peer.evaluation import dual_encoder, held_out_set, recall_untrained
from benchmarks.peer.hnce_training import DEMO, Setup, check_checkpoints, hnce_runs, shared_recipe
from benchmarks.peer.peer_training import peer_run, require_bench_extra
from benchmarks.peer.report import write_raw, write_results
from benchmarks.peer.step_profile import profile_hnce_step
from hnce.encoders.biencoder import minilm_path
from hnce.encoders.progress import quiet
from hnce.pipeline.config import load_config
from hnce.pipeline.demo import demo_dataset


def parse_args() -> argparse.Namespace:
    """The command line: checkpoint steps, the optional extra measures, work directory, recipe
    overrides and the result file."""
    parser = harness.arguments(__doc__, "peer_sentence_transformers", work_dir=None)
    parser.add_argument("--checkpoints", default="30,60")
    parser.add_argument(
        "--check-product",
        action="store_true",
        help="also evaluate hnce's final export through evaluate_export (actors + FAISS)",
    )
    parser.add_argument(
        "--cosine",
        action="store_true",
        help="also train hnce with model.normalize, the peer's temperature 0.05 and "
        "negatives version 0 mined with the starting model",
    )
    parser.add_argument("--set", action="append", default=[], help="recipe overrides (smoke runs)")
    return harness.parse(parser)


@quiet()  # no progress bars from hnce in this process
def main() -> None:
    """Measure every method (finished ones read back from ``<work>/state.json``), then write
    the results."""
    args = parse_args()
    require_bench_extra()
    checkpoints = [int(step) for step in args.checkpoints.split(",")]
    torch.set_num_threads(2)
    timer = harness.Timer()
    with tempfile.TemporaryDirectory(prefix="hnce-peer-") as scratch:
        work = args.work_dir or Path(scratch)
        recipe = shared_recipe(work, checkpoints, args.set)
        config, counts = demo_dataset(load_config(DEMO, recipe))
        check_checkpoints(checkpoints, config.training.checkpoint_every)
        held_out = held_out_set(config)
        untrained = dual_encoder(minilm_path(), config)
        untrained_recall = recall_untrained(untrained, held_out)
        print("untrained", untrained_recall, flush=True)
        state = harness.StageState(work / "state.json").load()
        setup = Setup(work, state, recipe, config, checkpoints, held_out)
        runs = hnce_runs(setup, args.cosine, args.check_product)
        peer = peer_run(setup, runs[0].trained, untrained)
        profile = profile_hnce_step(setup.method_config("profile"))
    total = timer.elapsed()
    write_raw(args.output.with_suffix(".json"), untrained_recall, runs, peer)
    write_results(args.output, counts, untrained_recall, runs, peer, total, profile)


if __name__ == "__main__":
    main()
