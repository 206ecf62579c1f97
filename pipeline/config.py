"""Typed run configuration, grouped by concern as in ColBERT's settings.

A recipe is a YAML file (read with ``yaml.safe_load``) whose top-level sections map one to one
onto the dataclasses below; ``--set section.key=value`` overrides are applied on top. Every
check runs before any work starts: an unknown key, a value of the wrong type, or a scorer that
cannot be put in an index (poly, genpoly, joint) asked to mine negatives from an index raises
:class:`ConfigError` naming the key and, for keys from a file, the file and line.

Example::

    config = load_config(Path("configs/demo.yaml"), ["training.steps=200", "negatives.sampler=hard"])
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mining.losses import build_loss

# Scorers of DESIGN.md §3 whose entity side is a fixed set of vectors; the others depend on the
# mention at scoring time and so cannot be searched in FAISS.
INDEXABLE_SCORERS = frozenset({"dual", "multi", "som", "general"})
NON_INDEXABLE_SCORERS = frozenset({"poly", "genpoly", "joint"})
SAMPLERS_FROM_INDEX = frozenset({"hard", "greedy", "mixed", "ance", "ohem", "adversarial"})
# Samplers the trainer builds from the config alone. lexical (entity texts for BM25),
# momentum-queue (an embedding queue) and adversarial (a generator update per step) exist in
# mining/ but are not wired into the trainer, so asking for them fails here, before any work.
TRAINER_SAMPLERS = frozenset({"random", "hard", "greedy", "mixed", "in-batch", "ance", "ohem"})


_YAML11_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


class ConfigError(ValueError):
    """A malformed configuration; the message names the offending key (and file:line)."""


@dataclass
class RunSettings:
    """Where a run lives: ``<dir>/checkpoints``, ``<dir>/index``, ``<dir>/negatives``, logs."""

    dir: str = "runs/default"
    seed: int = 0


@dataclass
class DataSettings:
    """A dataset directory in the Parquet contract (DESIGN.md §2) and the splits used."""

    root: str = "data/wordnet"
    train_split: str = "train"
    eval_split: str = "test"
    max_train_mentions: int = 0  # 0 = all
    max_eval_mentions: int = 0  # 0 = all


@dataclass
class ScorerSettings:
    """Score function of DESIGN.md §3 (eq. 9): dual | multi | som | poly | genpoly | general | joint."""

    name: str = "dual"
    m: int = 1


@dataclass
class ModelSettings:
    """Encoder towers: ``minilm`` (the PyPI-packaged all-MiniLM-L6-v2) or a local model directory."""

    path: str = "minilm"
    mention_length: int = 32
    entity_length: int = 64
    scorer: ScorerSettings = field(default_factory=ScorerSettings)


@dataclass
class NegativesSettings:
    """Negative sampling (DESIGN.md §4): K negatives per mention from ``sampler``.

    ``source: index`` mines candidates from the newest refreshed index version (the asynchronous
    refresh of §5); ``source: none`` uses only samplers that need no candidates (random, in-batch).
    Before the first refresh the trainer falls back to random negatives.
    """

    sampler: str = "mixed"
    num_negatives: int = 8
    hard_fraction: float = 0.5  # mixed-p: p = 100 * hard_fraction
    source: str = "index"
    top_n: int = 64  # candidates per mention kept in a negatives version
    filter_false_negatives: bool = True


@dataclass
class LossSettings:
    """Contrastive loss (DESIGN.md §4): nce (eq. 5/11) | sampled-softmax | binary-nce | ..."""

    name: str = "nce"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainingSettings:
    """DeepSpeed optimisation under Ray Train (paper §6.3: Adam, hard-negative NCE)."""

    steps: int = 1000
    batch_size: int = 16  # mentions per worker per micro-step
    gradient_accumulation: int = 1
    learning_rate: float = 2e-5
    warmup_steps: int = 100
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    zero_stage: int = 0
    precision: str = "auto"  # auto (bf16 where supported, else fp32) | bf16 | fp32
    num_workers: int = 2
    checkpoint_every: int = 100  # R: publish step-<S>/ for the refresh coordinator
    negatives_check_every: int = 10  # C: switch to the newest negatives version
    keep_checkpoints: int = 3
    max_failures: int = 2
    log_every: int = 10
    cpus_per_worker: float = 1.0


@dataclass
class RefreshSettings:
    """The asynchronous refresh (DESIGN.md §5): re-encode the catalogue, mine train negatives."""

    enabled: bool = True
    num_encoders: int = 1
    encoder_cpus: float = 1.0
    batch_size: int = 128
    shard_size: int = 100_000  # catalogue rows per index shard (one FAISS file each)


@dataclass
class IndexSettings:
    """FAISS index of a version: flat (exact, for mining) | ivfpq | hnsw (approximate, serving).

    ``faiss_device``: auto | cpu | gpu; GPU shards are fp16 flat, ``gpu`` without one is an
    error. ``num_shards``: shards of the index ``hnce eval`` builds (the refresh shards by
    ``refresh.shard_size`` rows).
    """

    kind: str = "flat"
    faiss_device: str = "auto"
    num_shards: int = 1
    keep_versions: int = 2


@dataclass
class ClusterSettings:
    """Where Ray runs: ``local`` starts an instance on this machine, else an address."""

    address: str = "local"
    num_cpus: int = 0  # local instance only; 0 = all cores
    use_gpu: bool = False
    dashboard_host: str = "127.0.0.1"


@dataclass
class EvalSettings:
    """Recall@k against the whole catalogue through the index, accuracy = recall@1."""

    ks: list[int] = field(default_factory=lambda: [1, 8, 64, 100])
    batch_size: int = 256
    max_entities: int = 0  # 0 = whole catalogue
    per_domain_catalogue: bool = False  # Zeshel: link each mention within its own domain


@dataclass
class DemoSettings:
    """``hnce demo``: the WordNet subset it trains and evaluates on (see configs/demo.yaml).

    The catalogue holds ``catalogue_entities`` synsets (0: all 117,659): every gold, then the
    other senses of the golds' lemmas (the ambiguous senses, the hard distractors; held-out
    mentions first), then random synsets.
    """

    wordnet_dir: str = "/usr/share/wordnet"
    catalogue_entities: int = 10000
    train_mentions: int = 2000
    eval_mentions: int = 500


@dataclass
class Config:
    """A whole recipe: one section per concern."""

    run: RunSettings = field(default_factory=RunSettings)
    data: DataSettings = field(default_factory=DataSettings)
    model: ModelSettings = field(default_factory=ModelSettings)
    negatives: NegativesSettings = field(default_factory=NegativesSettings)
    loss: LossSettings = field(default_factory=LossSettings)
    training: TrainingSettings = field(default_factory=TrainingSettings)
    refresh: RefreshSettings = field(default_factory=RefreshSettings)
    index: IndexSettings = field(default_factory=IndexSettings)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    eval: EvalSettings = field(default_factory=EvalSettings)
    demo: DemoSettings = field(default_factory=DemoSettings)

    @property
    def run_dir(self) -> Path:
        return Path(self.run.dir)

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (YAML/JSON-serialisable); ``config_from_dict`` inverts it."""
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------------------------
# Loading


def _yaml_lines(text: str) -> dict[str, int]:
    """Map each dotted key of a YAML mapping to its 1-based line, for error messages."""
    lines: dict[str, int] = {}

    def walk(node: yaml.Node, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key = f"{prefix}{key_node.value}"
                lines[key] = key_node.start_mark.line + 1
                walk(value_node, key + ".")

    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if root is not None:
        walk(root, "")
    return lines


def _where(key: str, origins: Mapping[str, str]) -> str:
    return origins.get(key) or origins.get("") or "config"


def _coerce(value: Any, annotation: Any, key: str, origins: Mapping[str, str]) -> Any:
    """Check ``value`` against a field annotation; ints are accepted where floats are expected."""
    origin = typing.get_origin(annotation)
    where = _where(key, origins)
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"{where}: '{key}' must be a mapping of settings, got {type(value).__name__}"
            )
        return _build(annotation, value, key + ".", origins)
    if origin in (list, Sequence):
        (item_type,) = typing.get_args(annotation)
        if not isinstance(value, list):
            raise ConfigError(f"{where}: '{key}' must be a list, got {type(value).__name__}")
        return [_coerce(v, item_type, f"{key}[{i}]", origins) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: '{key}' must be a mapping, got {type(value).__name__}")
        return dict(value)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(annotation):
            try:
                return _coerce(value, option, key, origins)
            except ConfigError:
                continue
        raise ConfigError(f"{where}: '{key}' has the wrong type ({type(value).__name__})")
    if annotation is Any:
        return value
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if annotation is float and isinstance(value, str) and _YAML11_FLOAT.fullmatch(value.strip()):
        # YAML 1.1 reads "1e-4" (no dot) as a string; accept it where a float is expected.
        return float(value)
    if annotation is type(None) and value is None:
        return None
    if annotation in (int, float, str, bool):
        if isinstance(value, bool) and annotation is not bool:
            ok = False
        else:
            ok = isinstance(value, annotation)
        if not ok:
            raise ConfigError(
                f"{where}: '{key}' must be {annotation.__name__}, "
                f"got {type(value).__name__} {value!r}"
            )
        return value
    raise ConfigError(f"{where}: '{key}' has an unsupported type {annotation!r}")


def _build(cls: type, values: Mapping[str, Any], prefix: str, origins: Mapping[str, str]) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for raw_key, value in values.items():
        key = f"{prefix}{raw_key}"
        if raw_key not in names:
            known = ", ".join(sorted(names))
            raise ConfigError(f"{_where(key, origins)}: unknown key '{key}' (known: {known})")
        kwargs[raw_key] = _coerce(value, hints[raw_key], key, origins)
    return cls(**kwargs)


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


def validate(config: Config) -> Config:
    """Cross-field checks that a type check cannot see; raise ``ConfigError`` naming the key."""
    scorer = config.model.scorer.name
    if scorer not in INDEXABLE_SCORERS | NON_INDEXABLE_SCORERS:
        known = ", ".join(sorted(INDEXABLE_SCORERS | NON_INDEXABLE_SCORERS))
        raise ConfigError(f"'model.scorer.name': unknown scorer {scorer!r} (known: {known})")
    if config.negatives.source not in ("index", "none"):
        raise ConfigError(
            f"'negatives.source' must be 'index' or 'none', got {config.negatives.source!r}"
        )
    if config.negatives.source == "index" and scorer in NON_INDEXABLE_SCORERS:
        raise ConfigError(
            f"'negatives.source: index' needs an indexable scorer, but 'model.scorer.name' is "
            f"{scorer!r} (query depends on the entity, DESIGN.md §3); use dual, multi or som, "
            f"or set negatives.source=none with a random sampler"
        )
    if config.negatives.sampler not in TRAINER_SAMPLERS:
        known = ", ".join(sorted(TRAINER_SAMPLERS))
        raise ConfigError(
            f"'negatives.sampler': the trainer cannot use {config.negatives.sampler!r} "
            f"(known: {known})"
        )
    try:
        build_loss(config.loss.name, **config.loss.options)
    except ValueError as error:
        raise ConfigError(f"'loss.name' / 'loss.options': {error}") from error
    if config.negatives.sampler in SAMPLERS_FROM_INDEX and config.negatives.source != "index":
        raise ConfigError(
            f"'negatives.sampler: {config.negatives.sampler}' mines from an index but "
            f"'negatives.source' is {config.negatives.source!r}"
        )
    if config.negatives.sampler in SAMPLERS_FROM_INDEX and not config.refresh.enabled:
        raise ConfigError(
            f"'negatives.sampler: {config.negatives.sampler}' needs refreshed negatives but "
            f"'refresh.enabled' is false"
        )
    if config.index.faiss_device not in ("auto", "cpu", "gpu"):
        raise ConfigError(
            f"'index.faiss_device' must be auto, cpu or gpu, got {config.index.faiss_device!r}"
        )
    if not 0.0 <= config.negatives.hard_fraction <= 1.0:
        raise ConfigError("'negatives.hard_fraction' must be within [0, 1]")
    positive = {
        "negatives.num_negatives": config.negatives.num_negatives,
        "negatives.top_n": config.negatives.top_n,
        "training.steps": config.training.steps,
        "training.batch_size": config.training.batch_size,
        "training.gradient_accumulation": config.training.gradient_accumulation,
        "training.num_workers": config.training.num_workers,
        "training.checkpoint_every": config.training.checkpoint_every,
        "training.negatives_check_every": config.training.negatives_check_every,
        "training.keep_checkpoints": config.training.keep_checkpoints,
        "training.log_every": config.training.log_every,
        "refresh.num_encoders": config.refresh.num_encoders,
        "refresh.batch_size": config.refresh.batch_size,
        "refresh.shard_size": config.refresh.shard_size,
        "index.num_shards": config.index.num_shards,
        "model.mention_length": config.model.mention_length,
        "model.entity_length": config.model.entity_length,
        "model.scorer.m": config.model.scorer.m,
        "eval.batch_size": config.eval.batch_size,
    }
    for key, value in positive.items():
        if value <= 0:
            raise ConfigError(f"'{key}' must be positive, got {value}")
    if config.negatives.top_n < config.negatives.num_negatives:
        raise ConfigError("'negatives.top_n' must be at least 'negatives.num_negatives'")
    if config.training.zero_stage not in (0, 1, 2, 3):
        raise ConfigError(f"'training.zero_stage' must be 0-3, got {config.training.zero_stage}")
    if config.training.precision not in ("auto", "bf16", "fp32"):
        raise ConfigError(
            f"'training.precision' must be auto, bf16 or fp32, got {config.training.precision!r}"
        )
    if config.training.precision == "bf16" and not config.cluster.use_gpu:
        raise ConfigError(
            "'training.precision: bf16' needs GPUs ('cluster.use_gpu: true'); on CPU use auto or fp32"
        )
    if config.training.warmup_steps < 0:
        raise ConfigError("'training.warmup_steps' must not be negative")
    if config.training.learning_rate <= 0:
        raise ConfigError("'training.learning_rate' must be positive")
    if config.index.kind not in ("flat", "ivfpq", "hnsw"):
        raise ConfigError(f"'index.kind' must be flat, ivfpq or hnsw, got {config.index.kind!r}")
    if not config.eval.ks or any(k <= 0 for k in config.eval.ks):
        raise ConfigError("'eval.ks' must be a non-empty list of positive integers")
    return config


def config_from_dict(tree: Mapping[str, Any], origins: Mapping[str, str] | None = None) -> Config:
    """Build and validate a :class:`Config` from a nested mapping."""
    return validate(_build(Config, tree, "", origins or {}))


def load_config(path: Path | None, overrides: Sequence[str] = ()) -> Config:
    """Read a YAML recipe (``safe_load``), apply ``section.key=value`` overrides, validate."""
    tree: dict[str, Any] = {}
    origins: dict[str, str] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"{path}: config file not found")
        text = path.read_text()
        try:
            loaded = yaml.safe_load(text)
            lines = _yaml_lines(text)
        except yaml.YAMLError as error:
            raise ConfigError(f"{path}: not valid YAML: {error}") from error
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}:1: top level must be a mapping of sections")
        tree = loaded or {}
        origins = {key: f"{path}:{line}" for key, line in lines.items()}
        origins[""] = str(path)
    for override in overrides:
        _apply_override(tree, override, origins)
    return config_from_dict(tree, origins)


def dump_config(config: Config, path: Path) -> None:
    """Write the resolved configuration next to a run, for reproducibility."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
