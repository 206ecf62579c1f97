"""``hnce refresh``: re-encode the catalogue into a new index version and mine negatives (docs/refresh.md).

Reads the same recipe as ``hnce train`` (``--config runs/<run>/config.yaml`` is the resolved one
training writes): ``run.dir``, ``data.root`` and the ``refresh`` and ``index`` sections. One
shot (cron, ``ray job submit``) or ``--every 6h`` on a fixed cadence; each run prints one JSON
line; ``--initial`` builds the initial negatives of the untrained model (index and negatives
version 0) before training. Exit codes: 0 done (or already up to date, or stopped by SIGTERM between refreshes),
2 a bad recipe or input, 3 no complete checkpoint, 75 another refresh of the run holds the lock,
143 abandoned on SIGTERM (resumable). The logic lives in ``hnce.cluster.compute.refresh.job``.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from hnce.events import RunEvent
from hnce.pipeline.cli._common import add_config_arguments, load_recipe

if TYPE_CHECKING:
    from hnce.cluster.compute.refresh.plan import RefreshPlan
    from hnce.pipeline.config import Config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--step", type=int, help="checkpoint step (default: newest complete)")
    when.add_argument("--every", help="repeat at this fixed cadence, e.g. 6h, 30m (default: once)")
    when.add_argument(
        "--initial",
        action="store_true",
        help="before training: the initial negatives of the untrained model (model.path): its "
        "index and the train split mined against it, so the trainer draws hard negatives from "
        "its first step",
    )


def run(args: argparse.Namespace) -> int:
    config = load_recipe(args)
    from hnce.cluster.compute.refresh.job import (
        StopRequest,
        parse_interval,
        refresh_every,
        refresh_once,
    )
    from hnce.cluster.compute.refresh.supervisor import beside_training
    from hnce.cluster.compute.session import init_ray
    from hnce.pipeline.preflight import check_refresh_inputs
    from hnce.pipeline.run import refresh_plan

    check_refresh_inputs(config)
    plan = beside_training(
        refresh_plan(config), config.cluster.use_gpu, config.training.num_workers
    )
    if args.initial:
        return _initial_version(config, plan)
    interval = parse_interval(args.every) if args.every is not None else None
    stop = StopRequest()
    stop.install()

    def connect() -> None:
        init_ray(config.cluster, config.refresh.encoder_cpus)  # keeps the SIGTERM handler

    if interval is None:
        return refresh_once(plan, args.step, connect=connect, stop=stop.event)
    return refresh_every(plan, interval, connect=connect, stop=stop.event)


def _initial_version(config: Config, plan: RefreshPlan) -> int:
    """The initial negatives of the untrained model (kept when the run has them)."""
    from hnce.cluster.compute.index_build import IndexedModel
    from hnce.cluster.compute.refresh.initial import initial_from_model
    from hnce.cluster.compute.session import init_ray
    from hnce.pipeline.recipe_models import untrained_export

    had = plan.negatives_store.current_version() is not None
    init_ray(config.cluster, config.refresh.num_encoders * config.refresh.encoder_cpus)
    starting_model = IndexedModel.from_export(untrained_export(config))
    initial_from_model(plan, starting_model, config.data.train_split)
    outcome = "up-to-date" if had else "published"
    record = {"event": RunEvent.REFRESH, "outcome": outcome, "index_version": 0}
    print(json.dumps({**record, "negatives_version": 0}), flush=True)
    return 0
