"""A CPU trainer step on subnormal floats, kept and flushed to zero (``flush_subnormal_floats``).

Once a batch is well separated, the contrastive loss's gradients and Adam's squared moments
underflow below fp32's smallest normal number (~1.2e-38); a CPU computes on such subnormal numbers
many times slower. hnce's CPU trainer workers flush them to zero (x86's FTZ/DAZ,
``torch.set_flush_denormal``) from their start. This benchmark trains the recipe where the
slow-down was found, random negatives on unnormalised scores (the
``random + shared`` cells of an earlier recipe comparison: WordNet, 1,000 synsets, 8 mentions a step with 4 negatives each, every
mention scored against every candidate of the step, learning rate 1e-4), under each of
``--scorers`` (sum-of-max, where it was found, and dual, the comparison's other family), twice
from the same seed, each run in a fresh process: with subnormals kept (the worker's
``flush_subnormal_floats`` replaced by nothing, as before it existed), and as the product runs.
Both runs are the product's worker step (:class:`~hnce.pipeline.train.worker.WorkerRun` in a
gloo group of one, its DeepSpeed engine, :func:`~hnce.pipeline.train.step.train_micro_batch`) on
the same batches.

Reported per run: seconds per step over the first and the last ``--steps // 3`` steps, the whole
run's seconds, and the share of Adam's second-moment entries that are subnormal at the end (they
stay subnormal in the kept run and are zero in the flushed one); and the largest difference
between the two runs' losses, step by step.

    .venv/bin/python -m benchmarks.subnormal_flush

writes ``benchmarks/results/subnormal_flush.md``.
"""

from __future__ import annotations

import multiprocessing
import tempfile
from pathlib import Path

import numpy as np
import torch

from benchmarks import harness
from hnce.pipeline.config import Config, config_from_dict, load_config
from hnce.pipeline.demo import demo_dataset
from hnce.pipeline.train import worker
from hnce.pipeline.train.one_process import single_process_group
from hnce.pipeline.train.step import train_micro_batch
from hnce.pipeline.train.task import TrainingTask
from hnce.pipeline.train.worker import WorkerRun
from hnce.progress import quiet

RECIPE = harness.ROOT / "configs" / "demo.yaml"
#: sum-of-max with random negatives shared across the step, refresh off
OVERRIDES = (
    "demo.catalogue_entities=1000",
    "demo.train_mentions=1000",
    "demo.unseen_eval_mentions=300",
    "model.normalize=false",
    "model.mention_length=24",
    "model.entity_length=24",
    "loss.temperature=null",
    "negatives.sampler=random",
    "negatives.cache.enabled=false",
    "negatives.source=none",
    "negatives.initial=random",
    "negatives.num_negatives=4",
    "negatives.share=batch",
    "training.learning_rate=1.0e-4",
    "training.warmup_steps=3",
    "training.cores=reserved",
    "refresh.enabled=false",
)


#: the two ways a run treats subnormal floats, by ``flush``
FLUSH = {False: "kept", True: "flushed"}


def scored(config: Config, scorer: str) -> list[str]:
    """The overrides that train ``config``'s cut data under ``scorer``."""
    return [f"data.root={config.data.root}", f"model.scorer.name={scorer}"]


def subnormal_share(optimizer: torch.optim.Optimizer) -> float:
    """Share of the entries of Adam's second moments (``exp_avg_sq``) that are subnormal."""
    tiny = torch.finfo(torch.float32).tiny
    subnormal = total = 0
    for state in optimizer.state.values():
        moments = state["exp_avg_sq"]
        subnormal += int(((moments != 0) & (moments.abs() < tiny)).sum())
        total += moments.numel()
    return subnormal / total


def train(tree: dict, flush: bool) -> dict[str, object]:
    """``training.steps`` steps of the product's worker on the recipe ``tree`` from its seed,
    in a fresh process (:func:`in_fresh_process`): as the product runs (``flush``), or with its
    ``flush_subnormal_floats`` replaced by nothing, as before it existed; each step's seconds and
    loss, and the subnormal share of Adam's second moments at the end."""
    if not flush:
        worker.flush_subnormal_floats = lambda: None
    config = config_from_dict(tree)
    seconds, losses = [], []
    with single_process_group():
        run = WorkerRun.build(
            config, TrainingTask.retriever(config), torch.device("cpu"), 1, lambda *_: None
        )
        run.engine.train()
        for index in range(config.training.steps):
            loss, elapsed = harness.timed(
                train_micro_batch, run.engine, run.micro_batch(index), run.loss
            )
            seconds.append(elapsed)
            losses.append(loss)
        share = subnormal_share(run.engine.optimizer)
    return {"seconds": seconds, "losses": losses, "subnormal_share": share}


def in_fresh_process(tree: dict, flush: bool) -> dict[str, object]:
    """:func:`train` in a new interpreter: the flag is per thread, and torch's intra-op threads
    take it from the thread that starts them, so a run must not inherit another's threads."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(train, (tree, flush))


@quiet()
def main() -> None:
    parser = harness.arguments(__doc__, "subnormal_flush", work_dir=None, steps=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--scorers", nargs="+", default=["som", "dual"])
    args = harness.parse(parser)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="hnce-subnormal-") as scratch:
        work = Path(args.work_dir or scratch)
        overrides = [
            f"run.dir={work / 'run'}",
            f"training.steps={args.steps}",
            f"training.cpus_per_worker={args.threads}",
            *OVERRIDES,
        ]
        config, counts = demo_dataset(load_config(RECIPE, overrides))
        runs = {
            (scorer, flush): in_fresh_process(
                load_config(RECIPE, [*overrides, *scored(config, scorer)]).to_dict(), flush
            )
            for scorer in args.scorers
            for flush in (False, True)
        }
    harness.write_json(
        args.output.with_suffix(".json"),
        {f"{scorer} {FLUSH[flush]}": run for (scorer, flush), run in runs.items()},
    )
    third = max(1, args.steps // 3)
    rows, findings = [], []
    for (scorer, flush), run in runs.items():
        seconds = np.asarray(run["seconds"])
        rows.append(
            f"| {scorer} | {FLUSH[flush]} | {np.median(seconds[:third]):.2f} | "
            f"{np.median(seconds[-third:]):.2f} | {seconds.sum():.1f} | "
            f"{run['subnormal_share']:.2%} |"
        )
    for scorer in args.scorers:
        kept, flushed = runs[scorer, False], runs[scorer, True]
        speed_up = np.sum(kept["seconds"]) / np.sum(flushed["seconds"])
        difference = np.max(np.abs(np.subtract(kept["losses"], flushed["losses"])))
        findings.append(
            f"- {scorer}: flushing is {speed_up:.1f}x as fast over the run; the largest "
            f"difference between the two runs' losses at any step: {difference:.2e} (final "
            f"loss {kept['losses'][-1]:.2e} kept, {flushed['losses'][-1]:.2e} flushed)."
        )
    lines = [
        "# A CPU trainer step on subnormal floats, kept and flushed (benchmarks/subnormal_flush.py)",
        "",
        f"Random negatives on unnormalised scores: {counts['entities']:,} WordNet synsets, "
        f"{config.training.batch_size} mentions a step with {config.negatives.num_negatives} "
        "negatives each, every mention scored against every candidate of the step, learning rate "
        f"{config.training.learning_rate:g}, the packaged MiniLM; the product's worker step, "
        f"{args.steps} steps from one seed on {args.threads} torch threads, first with subnormal "
        "floats kept, then flushed to zero as hnce's CPU workers run, each run in a fresh "
        f"process. Median seconds a step over the first and the last {third} steps; subnormal "
        "share: of Adam's second-moment entries at the end. Command: "
        f"`{harness.invocation('benchmarks.subnormal_flush')}`.",
        "",
        "| scorer | subnormals | s/step, first steps | s/step, last steps | seconds in all | "
        "subnormal share |",
        "|---|---|---:|---:|---:|---:|",
        *rows,
        "",
        *findings,
    ]
    harness.write_result(args.output, lines)


if __name__ == "__main__":
    main()
