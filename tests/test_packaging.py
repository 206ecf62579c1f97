"""Packaging: each install variant resolves to exactly one FAISS build, never faiss-cpu beside a
FAISS GPU wheel (both own the `faiss` module). The requirement sets are resolved offline, from
pyproject.toml and the metadata of the installed distributions, and the set-up script's check
(scripts/check_faiss_variant.py, which refuses a pip dry-run report) is exercised on reports."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "check_faiss_variant", REPO / "scripts" / "check_faiss_variant.py"
)
check_faiss_variant = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_faiss_variant)
canonical = check_faiss_variant.canonical


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _requirements(variant: str) -> list[Requirement]:
    project = _project()
    extras = project["optional-dependencies"]
    return [
        Requirement(text) for text in [*project["dependencies"], *extras[variant], *extras["dev"]]
    ]


def _applies(requirement: Requirement, extras: set[str]) -> bool:
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({"extra": extra}) for extra in extras | {""})


def _closure(requirements: list[Requirement]) -> tuple[set[str], set[str]]:
    """(every distribution the requirements pull in, those not installed here), walking the
    installed distributions' own requirements with their extras."""
    seen: set[str] = set()
    missing: set[str] = set()
    pending = [(requirement, set()) for requirement in requirements]
    while pending:
        requirement, parent_extras = pending.pop()
        if not _applies(requirement, parent_extras):
            continue
        name = canonical(requirement.name)
        key = f"{name}[{','.join(sorted(requirement.extras))}]"
        if key in seen:
            continue
        seen.add(key)
        try:
            distribution = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.add(name)
            continue
        pending.extend(
            (Requirement(text), set(requirement.extras)) for text in distribution.requires or []
        )
    return {key.split("[")[0] for key in seen}, missing


def test_base_install_has_no_faiss_and_each_variant_one() -> None:
    project = _project()
    assert (
        check_faiss_variant.faiss_builds(Requirement(text).name for text in project["dependencies"])
        == []
    )
    extras = project["optional-dependencies"]
    assert check_faiss_variant.faiss_builds(Requirement(t).name for t in extras["cpu"]) == [
        "faiss-cpu"
    ]
    assert check_faiss_variant.faiss_builds(Requirement(t).name for t in extras["gpu"]) == [
        "faiss-gpu-cu12"
    ]


@pytest.mark.parametrize(("variant", "build"), [("cpu", "faiss-cpu"), ("gpu", "faiss-gpu-cu12")])
def test_each_variant_resolves_to_exactly_its_faiss_build(variant: str, build: str) -> None:
    names, missing = _closure(_requirements(variant))
    assert check_faiss_variant.check(names, variant) == build
    # Only the GPU wheel itself is not installed here (so its own requirements, numpy and the
    # CUDA libraries, are not walked); everything else of both variants is.
    assert missing <= {"faiss-gpu-cu12"}, missing


def _report(path: Path, names: list[str]) -> Path:
    """A `pip install --dry-run --report` document installing `names`."""
    install = [{"metadata": {"name": name, "version": "1.0"}} for name in names]
    path.write_text(json.dumps({"version": "1", "install": install}))
    return path


def test_setup_check_refuses_a_resolution_with_both_faiss_builds(tmp_path: Path) -> None:
    both = _report(tmp_path / "both.json", ["numpy", "faiss_cpu", "faiss-gpu-cu12"])
    assert check_faiss_variant.main([str(both), "gpu"]) == 1
    assert check_faiss_variant.main([str(both), "cpu"]) == 1
    gpu = _report(tmp_path / "gpu.json", ["numpy", "faiss-gpu-cu12"])
    assert check_faiss_variant.main([str(gpu), "gpu"]) == 0
    assert check_faiss_variant.main([str(gpu), "cpu"]) == 1
    none = _report(tmp_path / "none.json", ["numpy"])
    assert check_faiss_variant.main([str(none), "cpu"]) == 1


def test_this_environment_holds_one_faiss_build() -> None:
    names = [dist.metadata["Name"] for dist in importlib.metadata.distributions()]
    assert len(check_faiss_variant.faiss_builds(names)) == 1, names


LAYERS = ("encoders", "mining", "cluster", "pipeline")


def _repository_packages() -> set[str]:
    """``hnce`` and every folder of the layer folders that holds an ``__init__.py``, named as
    the build configuration maps it (``mining/samplers`` is ``hnce.mining.samplers``)."""
    packages = {"hnce"}
    for layer in LAYERS:
        for init in (REPO / layer).rglob("__init__.py"):
            packages.add(".".join(("hnce", *init.parent.relative_to(REPO).parts)))
    return packages


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The distribution built as a user's ``pip install .`` builds it, from a copy of the tree,
    and unpacked."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for folder in ("hnce", *LAYERS):
        shutil.copytree(
            REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    out = tmp_path_factory.mktemp("wheel")
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run([*build, "--wheel-dir", str(out), str(source)], check=True)
    (built,) = out.glob("hnce-*.whl")
    unpacked = out / "unpacked"
    with zipfile.ZipFile(built) as archive:
        archive.extractall(unpacked)
    return unpacked


def test_the_wheel_installs_one_top_level_package_holding_every_layer(wheel: Path) -> None:
    top_level = {path.name for path in wheel.iterdir() if not path.name.endswith(".dist-info")}
    assert top_level == {"hnce"}
    packages = {
        ".".join(init.parent.relative_to(wheel).parts) for init in wheel.rglob("__init__.py")
    }
    assert packages == _repository_packages()


def test_the_installed_wheel_runs_from_its_own_files(wheel: Path, tmp_path: Path) -> None:
    """Imported from the unpacked wheel (not the checkout), the CLI starts and each layer
    resolves to the wheel's copy."""
    env = {**os.environ, "PYTHONPATH": str(wheel)}
    shown = subprocess.run(
        [
            sys.executable,
            "-c",
            "import importlib, sys\nfor name in sys.argv[1:]:\n"
            "    print(importlib.import_module(name).__file__)",
            *(f"hnce.{layer}" for layer in LAYERS),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    files = shown.stdout.split()
    assert len(files) == len(LAYERS) and all(Path(file).is_relative_to(wheel) for file in files)
    usage = subprocess.run(
        [sys.executable, "-m", "hnce.pipeline.cli.main", "--help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "usage: hnce" in usage.stdout
