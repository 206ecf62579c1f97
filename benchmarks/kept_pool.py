"""What the refresh coordinator's kept encoder pool saves: successive refreshes of one run, each on
an encoder pool of its own (as every refresh ran before) or on one pool kept from refresh to
refresh and reloaded with each new checkpoint (:class:`hnce.cluster.compute.encoder_pool.KeptPool`).

The demo's recipe (configs/demo.yaml: the packaged MiniLM, one encoder actor, held-out recall
with every refresh) on a WordNet subset of ``--entities`` synsets; each checkpoint is the packaged
model with its weights moved a little (so every refresh encodes the catalogue again), written as
the trainer writes one. Both arms refresh the same checkpoints in the same process, the fresh arm
first. Per refresh: the seconds to have a pool ready (``start`` for a new pool, ``reload`` for the
kept one), encoding and indexing, held-out recall, mining and the total; then the ratio of the
arms' mean totals over the refreshes after the first (the first starts a pool in both).

    .venv/bin/python -m benchmarks.kept_pool [--entities 2000 --refreshes 4]
"""

from __future__ import annotations

import shutil
import statistics
from pathlib import Path

import ray
import torch

from benchmarks import harness
from benchmarks.wordnet_runs import prepare_dataset, recipe
from hnce.cluster.compute.encoder_pool import KeptPool
from hnce.cluster.compute.refresh.engine import RefreshSummary, run_refresh
from hnce.cluster.stores.checkpoints import EXPORT_DIR, checkpoint_dir, mark_complete
from hnce.encoders.biencoder import build_biencoder, export_biencoder, minilm_path
from hnce.pipeline.config import Config
from hnce.pipeline.run import refresh_plan
from hnce.progress import quiet

STAGES = ("start", "reload", "index", "heldout", "mine", "total")


def write_checkpoints(run_dir: Path, config: Config, count: int) -> None:
    """Checkpoints 1..count of ``run_dir``: the packaged model, moved by 0.01 · N(0, 1) per
    weight and checkpoint (seeded), each exported and marked complete as the trainer does."""
    model = build_biencoder(
        minilm_path(),
        "dual",
        mention_length=config.model.mention_length,
        entity_length=config.model.entity_length,
        normalize=config.model.normalize,
    )
    generator = torch.Generator().manual_seed(0)
    for step in range(1, count + 1):
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.01 * torch.randn(parameter.shape, generator=generator))
        directory = checkpoint_dir(run_dir, step)
        export_biencoder(model, directory / EXPORT_DIR)
        mark_complete(directory, {"step": step})


def refresh_arm(
    work: Path, data: Path, refreshes: int, kept: KeptPool | None
) -> list[RefreshSummary]:
    """``refreshes`` refreshes of checkpoints 1, 2, ... of a new run, on ``kept`` (None: a pool
    of its own each)."""
    run_dir = work / ("kept" if kept is not None else "fresh")
    shutil.rmtree(run_dir, ignore_errors=True)
    config = recipe(run_dir, data)
    write_checkpoints(run_dir, config, refreshes)
    plan = refresh_plan(config)
    summaries = []
    for step in range(1, refreshes + 1):
        summaries.append(run_refresh(plan, step, kept=kept))
        print(f"{run_dir.name}: {summaries[-1].line()}", flush=True)
    return summaries


def stage_row(name: str, step: int, summary: RefreshSummary) -> str:
    cells = [
        f"{summary.seconds[stage]:.1f}" if stage in summary.seconds else "" for stage in STAGES
    ]
    return f"| {name} | {step} | " + " | ".join(cells) + " |"


def main() -> None:
    parser = harness.arguments(
        __doc__, "kept_pool", work_dir=Path("/tmp/hnce-kept-pool"), entities=2000, refreshes=4
    )
    args = harness.parse(parser)
    data = prepare_dataset(args.work_dir, args.entities, 400, 200)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    kept = KeptPool()
    try:
        with quiet():
            fresh = refresh_arm(args.work_dir, data, args.refreshes, None)
            reused = refresh_arm(args.work_dir, data, args.refreshes, kept)
    finally:
        kept.close()
        ray.shutdown()
    later_fresh = statistics.mean(s.seconds["total"] for s in fresh[1:])
    later_kept = statistics.mean(s.seconds["total"] for s in reused[1:])
    pool_fresh = statistics.mean(s.seconds["start"] for s in fresh[1:])
    pool_kept = statistics.mean(s.seconds["reload"] for s in reused[1:])
    lines = [
        "# Kept encoder pool: successive refreshes on one pool or a new pool each",
        "",
        f"WordNet subset of {args.entities:,} synsets (demo recipe: the packaged MiniLM, one "
        f"encoder actor, held-out recall with each refresh), {args.refreshes} refreshes of "
        "successive checkpoints per arm, 2 cores (`ray.init(num_cpus=2)`).",
        "",
        "| arm | checkpoint | " + " | ".join(f"{stage} s" for stage in STAGES) + " |",
        "|---|---|" + "---|" * len(STAGES),
        *(stage_row("pool per refresh", n, s) for n, s in enumerate(fresh, 1)),
        *(stage_row("kept pool", n, s) for n, s in enumerate(reused, 1)),
        "",
        f"Refreshes 2-{args.refreshes}: the pool ready in {pool_kept:.1f} s kept against "
        f"{pool_fresh:.1f} s started ({pool_fresh / pool_kept:.0f}x); a refresh takes "
        f"{later_kept:.1f} s against {later_fresh:.1f} s ({later_fresh / later_kept:.2f}x "
        "faster).",
    ]
    harness.write_result(args.output, lines)


if __name__ == "__main__":
    main()
