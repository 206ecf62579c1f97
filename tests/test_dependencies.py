"""Every third-party package the code imports is a declared dependency of hnce.

A package that only arrives through another one (pydantic through ``ray[default]``) breaks the
install the day that one drops it. The check walks every module of the package folders with
``ast``, maps each imported top-level name to the distribution that provides it
(``importlib.metadata.packages_distributions``) and looks for that distribution among the
``[project]`` dependencies or the FAISS extras (``cpu``/``gpu``: exactly one provides ``faiss``).
"""

from __future__ import annotations

import ast
import importlib.metadata
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
PACKAGE_FOLDERS = ("hnce", "encoders", "mining", "cluster", "pipeline")


def imported_names(folders: Iterable[Path]) -> dict[str, set[str]]:
    """Each top-level name imported by a module under ``folders`` (absolute imports only, anywhere
    in the module, lazy ones included) -> the modules importing it; stdlib and hnce left out."""
    names: dict[str, set[str]] = {}
    for folder in folders:
        for module in sorted(folder.rglob("*.py")):
            tree = ast.parse(module.read_text(encoding="utf-8"), filename=str(module))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    found = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found = [node.module]
                else:
                    continue
                for name in found:
                    top = name.split(".")[0]
                    if top != "hnce" and top not in sys.stdlib_module_names:
                        names.setdefault(top, set()).add(
                            module.relative_to(folder.parent).as_posix()
                        )
    return names


def undeclared(imports: dict[str, set[str]], declared: Iterable[str]) -> dict[str, set[str]]:
    """The imported names that no declared requirement provides -> the modules importing them.

    A name is provided when one of the distributions installed for it is declared; a name no
    installed distribution provides is reported as itself (it cannot be resolved, so it is not
    declared either)."""
    declared_names = {canonicalize_name(Requirement(text).name) for text in declared}
    providers = importlib.metadata.packages_distributions()
    missing: dict[str, set[str]] = {}
    for name, modules in imports.items():
        distributions = {canonicalize_name(dist) for dist in providers.get(name, [])}
        if not distributions & declared_names:
            missing[name] = modules
    return missing


def declared_requirements() -> list[str]:
    """``[project]`` dependencies and the FAISS extras (the ``cpu`` and ``gpu`` variants)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    return [*project["dependencies"], *extras["cpu"], *extras["gpu"]]


def _package_imports() -> dict[str, set[str]]:
    return imported_names(REPO / folder for folder in PACKAGE_FOLDERS)


def test_every_imported_package_is_declared() -> None:
    missing = undeclared(_package_imports(), declared_requirements())
    assert missing == {}, f"imported but not declared in pyproject.toml: {missing}"


def test_a_removed_dependency_is_reported_with_its_importers() -> None:
    imports = _package_imports()
    assert "pydantic" in imports and "yaml" in imports  # what the check must see
    without = [
        text
        for text in declared_requirements()
        if canonicalize_name(Requirement(text).name) not in {"pydantic", "pyyaml"}
    ]
    missing = undeclared(imports, without)
    assert set(missing) == {"pydantic", "yaml"}  # yaml: the import name differs from PyYAML's
    assert "pipeline/config/loader.py" in missing["yaml"]
    assert "hnce/settings.py" in missing["pydantic"]


def test_lazy_imports_count_and_relative_and_stdlib_ones_do_not(tmp_path: Path) -> None:
    (tmp_path / "module.py").write_text(
        "import os\nfrom . import sibling\nfrom hnce.errors import InputError\n"
        "def load():\n    import not_a_real_distribution.sub\n",
        encoding="utf-8",
    )
    imports = imported_names([tmp_path])
    assert set(imports) == {"not_a_real_distribution"}
    assert set(undeclared(imports, declared_requirements())) == {"not_a_real_distribution"}
