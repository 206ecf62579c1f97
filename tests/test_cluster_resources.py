"""The custom Ray resources the code requests match the ones ray_cluster.yaml advertises."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hnce.cluster.compute.resources import (
    CUSTOM_RESOURCES,
    ENCODER_RESOURCE,
    TRAINER_RESOURCE,
    custom_resource_request,
)

CLUSTER_YAML = Path(__file__).resolve().parents[1] / "ray_cluster.yaml"


def test_launcher_config_advertises_every_requested_resource() -> None:
    config = yaml.safe_load(CLUSTER_YAML.read_text())
    advertised = set()
    for node_type in config["available_node_types"].values():
        advertised |= set(node_type.get("resources", {}))
    assert set(CUSTOM_RESOURCES) <= advertised


def test_custom_resource_requested_only_when_advertised() -> None:
    assert custom_resource_request(ENCODER_RESOURCE, {"CPU": 2.0}) == {}
    assert custom_resource_request(ENCODER_RESOURCE, {ENCODER_RESOURCE: 2.0}) == {
        ENCODER_RESOURCE: 1.0
    }
    assert custom_resource_request(TRAINER_RESOURCE, {ENCODER_RESOURCE: 1.0}) == {}
    with pytest.raises(ValueError, match="unknown hnce resource"):
        custom_resource_request("gpu_fast", {})
