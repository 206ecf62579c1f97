"""The layering of docs/architecture.md is a checked contract: import-linter's contracts in
pyproject.toml (one-way layers, and which packages may import Ray, FAISS and DeepSpeed) hold for
the package as installed, and no module imports a layer by its folder name instead of ``hnce.*``."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAYERS = ("encoders", "mining", "cluster", "pipeline")


def _installed_layout(root: Path) -> Path:
    """A copy of the sources arranged as the wheel installs them (``hnce/<layer>/...``):
    import-linter finds a package's modules by walking its folder."""
    package = root / "hnce"
    shutil.copytree(REPO / "hnce", package, ignore=shutil.ignore_patterns("__pycache__"))
    for layer in LAYERS:
        shutil.copytree(REPO / layer, package / layer, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with the repository's contracts over the package laid out under ``root``."""
    return subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports")), str(REPO / "pyproject.toml")],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
    )


def test_every_import_contract_is_kept(tmp_path: Path) -> None:
    checked = lint_imports(_installed_layout(tmp_path))
    assert checked.returncode == 0, checked.stdout[-4000:] + checked.stderr[-2000:]
    assert " broken" in checked.stdout and "0 broken" in checked.stdout


def test_an_import_back_up_breaks_the_contract(tmp_path: Path) -> None:
    root = _installed_layout(tmp_path)
    scorers = root / "hnce" / "encoders" / "scorers.py"
    scorers.write_text(scorers.read_text() + "\nfrom hnce.mining.losses import build_loss\n")
    checked = lint_imports(root)
    assert checked.returncode != 0
    assert "hnce.encoders.scorers -> hnce.mining.losses" in checked.stdout


def test_inference_importing_the_trainer_breaks_the_contract(tmp_path: Path) -> None:
    """What searches a run (evaluation, the linker) shares with training from below the trainer."""
    root = _installed_layout(tmp_path)
    evaluate = root / "hnce" / "pipeline" / "evaluate.py"
    evaluate.write_text(
        evaluate.read_text() + "\nfrom hnce.pipeline.train.cores import resolve_cores\n"
    )
    checked = lint_imports(root)
    assert checked.returncode != 0
    assert "hnce.pipeline.evaluate -> hnce.pipeline.train.cores" in checked.stdout


def test_no_module_imports_a_layer_by_its_folder_name() -> None:
    sources = [
        REPO / "hnce",
        *(REPO / layer for layer in LAYERS),
        REPO / "tests",
        REPO / "benchmarks",
    ]
    found = []
    for folder in sources:
        for path in folder.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = (
                    [alias.name for alias in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom) and node.level == 0
                    else []
                )
                found += [
                    f"{path.relative_to(REPO)}:{node.lineno}: {name}"
                    for name in names
                    if name.split(".")[0] in LAYERS
                ]
    assert not found, "\n".join(found)


def test_every_pipeline_module_has_a_layer() -> None:
    """A module left out of the pipeline's layer contract would be checked by nothing."""
    import tomllib

    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    inside = next(c for c in contracts["contracts"] if c["name"].startswith("Inside the pipeline"))
    layered = {
        name.strip().removeprefix("hnce.pipeline.")
        for layer in inside["layers"]
        for name in layer.replace("|", ":").split(":")
    }
    modules = {
        path.stem if path.is_file() else path.name
        for path in (REPO / "pipeline").iterdir()
        if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").is_file()
    }
    assert modules - layered == set()
