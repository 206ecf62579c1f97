"""Reading a recipe: safe YAML with duplicate keys and alias bombs refused, ``--set`` dotted
overrides on top, each key's ``file:line`` recorded, then the tree typed by pydantic into a
:class:`Config` and validated (:mod:`.validation`); and writing the resolved recipe back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

from hnce.cluster.stores.files import atomic_write_text
from hnce.pipeline.config.origins import ConfigError, dotted, origin_of
from hnce.pipeline.config.sections import Config
from hnce.pipeline.config.validation import validate
from hnce.text import NotText, read_text_file

_CONFIG = TypeAdapter(Config)


#: A recipe expands to at most this many YAML nodes (aliases counted at every use): far above any
#: real recipe, far below what an alias bomb (a few hundred bytes, billions of nodes) expands to.
MAX_RECIPE_NODES = 100_000


class _RecipeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping (naming both lines) and
    a key that is not a plain scalar (a list or mapping as key)."""

    source = "config"

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):
                raise ConfigError(
                    f"{self.source}:{line}: a key must be a plain name, not a {key_node.id}"
                )
            key = self.construct_object(key_node, deep=True)
            if key in first_line:
                raise ConfigError(
                    f"{self.source}:{line}: duplicate key {key!r} (first given at line "
                    f"{first_line[key]}); a recipe gives each setting once"
                )
            first_line[key] = line
        return super().construct_mapping(node, deep=deep)


def _check_expansion(root: yaml.Node, source: Path) -> None:
    """Refuse a document whose aliases refer to themselves or expand it beyond
    :data:`MAX_RECIPE_NODES` nodes (counted once per distinct node, so this is linear)."""
    sizes: dict[int, int] = {}
    pending: list[tuple[yaml.Node, bool]] = [(root, False)]
    open_nodes: set[int] = set()
    while pending:
        node, children_done = pending.pop()
        children = _children(node)
        if children_done:
            open_nodes.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes[id(child)] for child in children)
            if sizes[id(node)] > MAX_RECIPE_NODES:
                line = node.start_mark.line + 1
                raise ConfigError(
                    f"{source}:{line}: the recipe expands to more than {MAX_RECIPE_NODES:,} "
                    f"values through its aliases; a recipe is a few dozen settings"
                )
            continue
        if id(node) in sizes:
            continue
        if id(node) in open_nodes:
            raise ConfigError(f"{source}:{node.start_mark.line + 1}: an alias refers to itself")
        open_nodes.add(id(node))
        pending.append((node, True))
        pending.extend((child, False) for child in children if id(child) not in sizes)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _yaml_lines(node: yaml.Node | None, prefix: str = "") -> dict[str, int]:
    """Map each dotted key of a composed YAML mapping to its 1-based line."""
    lines: dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = f"{prefix}{key_node.value}"
            lines[key] = key_node.start_mark.line + 1
            lines.update(_yaml_lines(value_node, key + "."))
    return lines


def _recipe_text(path: Path) -> str:
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        return read_text_file(path)
    except NotText as error:
        raise ConfigError(str(error)) from None


def _yaml_error(path: Path, error: yaml.YAMLError) -> ConfigError:
    """``file:line: problem`` for a YAML error (the line of its mark, when it has one)."""
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    origin = f"{path}:{mark.line + 1}" if mark is not None else str(path)
    problem = getattr(error, "problem", None) or str(error)
    return ConfigError(f"{origin}: not valid YAML: {problem}")


def read_recipe(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The recipe's tree and the origin (``file:line``) of each dotted key."""
    text = _recipe_text(path)
    try:
        loader = _RecipeLoader(text)  # refuses characters YAML does not allow, at once
    except yaml.reader.ReaderError as error:
        line = text.count("\n", 0, error.position) + 1
        raise ConfigError(
            f"{path}:{line}: not valid YAML: character {error.character:#06x} is not allowed"
        ) from None
    loader.source = str(path)
    try:
        node = loader.get_single_node()
        if node is not None:
            _check_expansion(node, path)
        loaded = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as error:
        raise _yaml_error(path, error) from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a recipe") from None
    finally:
        loader.dispose()
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{path}:1: top level must be a mapping of sections")
    origins = {key: f"{path}:{line}" for key, line in _yaml_lines(node).items()}
    origins[""] = str(path)
    return loaded or {}, origins


def _apply_override(tree: dict[str, Any], override: str, origins: dict[str, str]) -> None:
    """Apply one ``section.key=value`` override; the value is parsed as YAML (``8``, ``true``)."""
    if "=" not in override:
        raise ConfigError(f"--set {override!r}: expected section.key=value")
    dotted, raw_value = override.split("=", 1)
    parts = dotted.strip().split(".")
    if len(parts) < 2 or not all(parts):
        raise ConfigError(f"--set {override!r}: expected section.key=value")
    try:
        value = yaml.safe_load(raw_value) if raw_value.strip() else ""
    except yaml.YAMLError as error:
        raise ConfigError(f"--set {override!r}: value is not valid YAML: {error}") from error
    node = tree
    for depth, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            bad = ".".join(parts[: depth + 1])
            raise ConfigError(f"--set {override!r}: '{bad}' is not a section")
        node = child
    node[parts[-1]] = value
    origins[dotted.strip()] = f"--set {override}"


def _errors(error: ValidationError, origins: Mapping[str, str]) -> ConfigError:
    """One :class:`ConfigError` listing every problem pydantic found, each with its origin."""
    lines = []
    for problem in error.errors(include_url=False):
        key = dotted(problem["loc"])
        origin = origin_of(key.split("[")[0], origins)
        message = problem["msg"].removeprefix("Value error, ")
        if problem["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
            lines.append(f"{origin}: unknown key '{key}'")
            continue
        value = problem.get("input")
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        lines.append(f"{origin}: '{key}': {message}{shown}")
    return ConfigError("\n".join(lines))


def config_from_dict(tree: Mapping[str, Any], origins: Mapping[str, str] | None = None) -> Config:
    """Build and validate a :class:`Config` from a nested mapping."""
    origins = dict(origins or {})
    try:
        config = _CONFIG.validate_python(dict(tree))
    except ValidationError as error:
        raise _errors(error, origins) from None
    object.__setattr__(config, "_origins", origins)
    return validate(config)


def load_config(path: Path | None, overrides: Sequence[str] = ()) -> Config:
    """Read a YAML recipe (safe, duplicate keys refused), apply overrides, validate."""
    tree: dict[str, Any] = {}
    origins: dict[str, str] = {}
    if path is not None:
        tree, origins = read_recipe(Path(path))
    for override in overrides:
        _apply_override(tree, override, origins)
    return config_from_dict(tree, origins)


def dump_config(config: Config, path: Path) -> None:
    """Write the resolved configuration next to a run, for reproducibility."""
    atomic_write_text(path, yaml.safe_dump(config.to_dict(), sort_keys=False))
