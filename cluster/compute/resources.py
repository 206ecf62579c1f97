"""Names of the custom Ray resources hnce schedules on (docs/refresh.md).

`ray_cluster.yaml` advertises these on its node types; the code requests them only when the
running cluster advertises them, so a plain local instance (`ray.init()`) schedules on CPU/GPU
alone. Keep the names here, and nowhere else, so the launcher config and a test can check them.
"""

from __future__ import annotations

from collections.abc import Mapping

ENCODER_RESOURCE = "hnce_encoder"
"""One unit per GPU encoder node slot; requested by each entity-encoder actor."""

TRAINER_RESOURCE = "hnce_trainer"
"""One unit per trainer worker slot; requested by each DeepSpeed worker (pipeline/train)."""

CUSTOM_RESOURCES = (ENCODER_RESOURCE, TRAINER_RESOURCE)


def custom_resource_request(name: str, cluster_resources: Mapping[str, float]) -> dict[str, float]:
    """`{name: 1}` when the cluster advertises `name` (from `ray.cluster_resources()`), else `{}`.

    Asking for a resource no node has would leave the actor pending forever, so a local instance
    without the launcher's custom resources gets a plain CPU/GPU request instead.
    """
    if name not in CUSTOM_RESOURCES:
        raise ValueError(f"unknown hnce resource {name!r}; expected one of {CUSTOM_RESOURCES}")
    return {name: 1.0} if cluster_resources.get(name, 0.0) >= 1.0 else {}
