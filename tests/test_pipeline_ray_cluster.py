"""ray_cluster.yaml is a valid launcher config naming exactly the custom resources the code asks for."""

from __future__ import annotations

import ast
from pathlib import Path

import yaml

from cluster import resources

ROOT = Path(__file__).resolve().parents[1]
BUILTIN = {"CPU", "GPU", "memory", "object_store_memory"}
REQUIRED = (
    "cluster_name",
    "max_workers",
    "provider",
    "auth",
    "available_node_types",
    "head_node_type",
    "setup_commands",
    "head_start_ray_commands",
    "worker_start_ray_commands",
)


def launcher_config() -> dict:
    return yaml.safe_load((ROOT / "ray_cluster.yaml").read_text())


def requested_resources() -> set[str]:
    """Resource names the code passes to `custom_resource_request` (pipeline/ and cluster/)."""
    names = {"ENCODER_RESOURCE": resources.ENCODER_RESOURCE}
    names["TRAINER_RESOURCE"] = resources.TRAINER_RESOURCE
    found = set()
    for path in [*ROOT.glob("pipeline/**/*.py"), *ROOT.glob("cluster/**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", getattr(node.func, "attr", None))
                == "custom_resource_request"
                and node.args
            ):
                argument = node.args[0]
                if isinstance(argument, ast.Name) and argument.id in names:
                    found.add(names[argument.id])
                elif isinstance(argument, ast.Constant):
                    found.add(argument.value)
    return found


def test_required_fields_and_ray_schema() -> None:
    from ray.autoscaler._private.util import validate_config

    config = launcher_config()
    for key in REQUIRED:
        assert key in config, key
    assert config["head_node_type"] in config["available_node_types"]
    validate_config(config)  # Ray's own JSON schema + consistency checks


def test_gpu_encoder_and_trainer_nodes() -> None:
    node_types = launcher_config()["available_node_types"]
    by_resource = {name: node for node in node_types.values() for name in node.get("resources", {})}
    assert by_resource[resources.ENCODER_RESOURCE]["resources"].get("GPU", 0) >= 1
    assert by_resource[resources.TRAINER_RESOURCE]["resources"].get("GPU", 0) >= 1


def test_custom_resources_are_exactly_those_requested() -> None:
    node_types = launcher_config()["available_node_types"].values()
    advertised = {name for node in node_types for name in node.get("resources", {})} - BUILTIN
    assert advertised == set(resources.CUSTOM_RESOURCES)
    assert requested_resources() == set(resources.CUSTOM_RESOURCES)


def test_setup_installs_the_project_and_dashboard_is_local() -> None:
    config = launcher_config()
    setup = "\n".join(config["setup_commands"])
    assert "pip install" in setup and "-e" in setup and "constraints.txt" in setup
    head = "\n".join(config["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head
