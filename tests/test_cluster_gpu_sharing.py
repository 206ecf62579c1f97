"""Who holds the GPUs while training (``cluster.gpu_sharing``): every plan leaves room for the
encoders beside the trainer, or is refused at once; the encoder pool counts only the GPUs the
trainer leaves. The placement itself on a real GPU is checked by ``benchmarks/gpu_paths.py``."""

from __future__ import annotations

import pytest
from training_helpers import CONFIGS

from hnce.cluster.compute.actors import PlacementError
from hnce.cluster.compute.gpu_sharing import (
    SHARED_GPU,
    GpuPlan,
    encoders_on_gpus,
    resolve_gpu_sharing,
)
from hnce.pipeline.config import ConfigError, load_config


def fits(plan: GpuPlan, cluster_gpus: float, workers: int) -> bool:
    """The trainer's workers and the pool's encoders together within the cluster's GPUs, each on
    one device (a share never spans two GPUs)."""
    encoders = encoders_on_gpus(cluster_gpus, plan.trainer_gpus, plan.encoder_gpus)
    held = workers * plan.worker_gpus + encoders * plan.encoder_gpus
    return held <= cluster_gpus and max(plan.worker_gpus, plan.encoder_gpus) <= 1.0


def test_one_gpu_with_a_refresh_is_shared_half_and_half_and_both_fit() -> None:
    plan = resolve_gpu_sharing("auto", True, 1.0, 1, encoders_beside=True)
    assert (plan.mode, plan.worker_gpus, plan.encoder_gpus) == ("shared", SHARED_GPU, SHARED_GPU)
    assert plan.trainer_gpus == SHARED_GPU
    assert encoders_on_gpus(1.0, plan.trainer_gpus, plan.encoder_gpus) == 1
    assert fits(plan, 1.0, 1)
    assert "1 GPU(s) for 1 trainer worker(s)" in plan.why


def test_as_many_gpus_as_workers_share_one_encoder_per_gpu() -> None:
    plan = resolve_gpu_sharing("auto", True, 4.0, 4, encoders_beside=True)
    assert plan.mode == "shared"
    assert encoders_on_gpus(4.0, plan.trainer_gpus, plan.encoder_gpus) == 4
    assert fits(plan, 4.0, 4)


def test_a_spare_gpu_goes_whole_to_the_encoders_and_only_the_spare_ones_are_counted() -> None:
    plan = resolve_gpu_sharing("auto", True, 2.0, 1, encoders_beside=True)
    assert (plan.mode, plan.worker_gpus, plan.encoder_gpus, plan.trainer_gpus) == (
        "dedicated",
        1.0,
        1.0,
        1.0,
    )
    # one encoder, not one per GPU of the cluster: the trainer's GPU is never the pool's
    assert encoders_on_gpus(2.0, plan.trainer_gpus, plan.encoder_gpus) == 1
    assert fits(plan, 2.0, 1)


@pytest.mark.parametrize(
    ("encoders_beside", "slots", "reason"),
    [(False, False, "no encoder runs beside"), (True, True, "hnce_encoder slots")],
)
def test_no_sharing_without_encoders_beside_or_with_encoder_slots(
    encoders_beside: bool, slots: bool, reason: str
) -> None:
    plan = resolve_gpu_sharing("auto", True, 1.0, 1, encoders_beside, encoder_slots=slots)
    assert (plan.mode, plan.worker_gpus) == ("dedicated", 1.0)
    assert reason in plan.why


def test_dedicated_with_no_gpu_left_for_the_encoders_is_refused_at_once() -> None:
    with pytest.raises(PlacementError, match=r"cluster\.gpu_sharing is dedicated.*none is left"):
        resolve_gpu_sharing("dedicated", True, 2.0, 2, encoders_beside=True)


def test_shared_when_asked_even_with_spare_gpus() -> None:
    plan = resolve_gpu_sharing("shared", True, 8.0, 2, encoders_beside=True)
    assert (plan.mode, plan.trainer_gpus) == ("shared", 2 * SHARED_GPU)
    assert encoders_on_gpus(8.0, plan.trainer_gpus, plan.encoder_gpus) == 14
    assert fits(plan, 8.0, 2)


def test_a_cpu_run_asks_for_no_gpu_and_a_cpu_pool_has_one_actor() -> None:
    plan = resolve_gpu_sharing("auto", False, 0.0, 2, encoders_beside=True)
    assert (plan.worker_gpus, plan.trainer_gpus) == (0.0, 0.0)
    assert encoders_on_gpus(0.0, plan.trainer_gpus, plan.encoder_gpus) == 1


def test_sharing_asked_for_without_gpus_is_a_recipe_error() -> None:
    with pytest.raises(ConfigError, match=r"cluster\.gpu_sharing"):
        load_config(CONFIGS / "synthetic-test.yaml", ["cluster.gpu_sharing=shared"])
