"""What ``training.keep_deepspeed_state: newest`` saves on disk: a run's kept checkpoints with the
DeepSpeed state of every one (``all``, the default) or of the newest only, which training resumes
from (docs/stores.md).

The demo's recipe (configs/demo.yaml: the packaged all-MiniLM-L6-v2, Adam under DeepSpeed ZeRO
stage 0) trains ``--steps`` steps through ``hnce train``'s driver with a checkpoint every
``--checkpoint-every`` steps and ``training.keep_checkpoints`` 3, once per setting, on the
package's synthetic dataset with random negatives and no refresh (what a checkpoint holds does not
depend on the data or the negatives). Reported: the bytes ``checkpoints/`` takes on disk as
``hnce status`` counts them (allocated blocks, like ``du``), and from the two totals one
checkpoint's export and DeepSpeed state (K checkpoints hold K exports and K or 1 states).

    .venv/bin/python -m benchmarks.checkpoint_disk [--steps 6 --checkpoint-every 2] --nice 10

writes ``benchmarks/results/checkpoint_disk.md``.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from benchmarks import harness
from hnce.cluster.stores.checkpoints import CHECKPOINTS_DIR, complete_checkpoints
from hnce.pipeline.config import load_config
from hnce.pipeline.data.synthetic import generate_synthetic_dataset
from hnce.pipeline.status import run_status
from hnce.pipeline.train.trainer import run_training
from hnce.progress import quiet

KEEP = 3
SETTINGS = ("all", "newest")
_MIB = 1024 * 1024


def train_arm(args: argparse.Namespace, data: Path, setting: str) -> dict[str, float]:
    """One run with ``training.keep_deepspeed_state`` ``setting``: its seconds, the checkpoints
    it kept and the bytes of ``checkpoints/``."""
    run_dir = args.work_dir / setting
    shutil.rmtree(run_dir, ignore_errors=True)
    config = load_config(
        harness.ROOT / "configs" / "demo.yaml",
        [
            f"run.dir={run_dir}",
            f"data.root={data}",
            f"training.steps={args.steps}",
            f"training.checkpoint_every={args.checkpoint_every}",
            f"training.keep_checkpoints={KEEP}",
            f"training.keep_deepspeed_state={setting}",
            "negatives.sampler=random",
            "negatives.cache.enabled=false",
            "negatives.initial=random",
            "refresh.enabled=false",
        ],
    )
    _, seconds = harness.timed(lambda: run_training(config))
    kept = len(complete_checkpoints(run_dir))
    used = run_status(run_dir).disk_bytes[CHECKPOINTS_DIR]
    shutil.rmtree(run_dir)  # gigabytes of checkpoints: not kept
    return {"seconds": seconds, "kept": kept, "bytes": used}


def report_lines(args: argparse.Namespace, arms: dict[str, dict[str, float]]) -> list[str]:
    """The result file: both runs, one checkpoint's parts, the saving."""
    full, slim = arms["all"], arms["newest"]
    kept = int(full["kept"])
    state = (full["bytes"] - slim["bytes"]) / (kept - 1)
    export = full["bytes"] / kept - state
    rows = [
        f"| `{setting}` | {int(arm['kept'])} | {arm['bytes'] / _MIB:,.0f} | {arm['seconds']:.0f} |"
        for setting, arm in arms.items()
    ]
    saved = full["bytes"] - slim["bytes"]
    return [
        "# Checkpoints on disk: the DeepSpeed state of every checkpoint or of the newest",
        "",
        f"configs/demo.yaml (packaged all-MiniLM-L6-v2, DeepSpeed ZeRO stage 0, Adam) trained "
        f"{args.steps} steps through `hnce train`'s driver, a checkpoint every "
        f"{args.checkpoint_every} steps, `training.keep_checkpoints` {KEEP}, random negatives, no "
        f"refresh, on this machine's 2 cores. Command: "
        f"`{harness.invocation('benchmarks.checkpoint_disk')}`.",
        "",
        "| `training.keep_deepspeed_state` | checkpoints kept | `checkpoints/` MiB | run s |",
        "|---|---:|---:|---:|",
        *rows,
        "",
        f"One checkpoint is {export / _MIB:,.0f} MiB of export and {state / _MIB:,.0f} MiB of "
        f"DeepSpeed state (weights, Adam's two moments: {state / export:.1f}x the export). "
        f"Keeping the state of the newest only saved {saved / _MIB:,.0f} MiB "
        f"({saved / full['bytes']:.0%} of `checkpoints/`): each older checkpoint shrinks to its "
        f"export, what refreshes, `hnce eval` and `hnce export` read.",
    ]


@quiet()  # no progress bars from hnce in this process
def main() -> None:
    parser = harness.arguments(
        __doc__,
        "checkpoint_disk",
        work_dir=Path("/tmp/hnce-checkpoint-disk"),
        steps=6,
        checkpoint_every=2,
    )
    args = harness.parse(parser)
    data = args.work_dir / "synthetic"
    if not data.is_dir():
        generate_synthetic_dataset(data)
    arms = {setting: train_arm(args, data, setting) for setting in SETTINGS}
    harness.write_result(args.output, report_lines(args, arms))


if __name__ == "__main__":
    main()
