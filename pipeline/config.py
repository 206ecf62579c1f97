"""hnce's one settings tree: every command of a run reads the same recipe (ColBERT-style sections).

A recipe is a YAML file whose top-level sections are the fields of :class:`Config`; ``--set
section.key=value`` overrides are applied on top, and :func:`load_config` validates the whole
tree before any work starts. Sections are declared where they are consumed and composed here:

=========  ==============================================  ===============================
section    what                                            declared in
=========  ==============================================  ===============================
run        run directory, seed                             here
data       dataset directory and splits                    here
model      towers, lengths, pooling, ``scorer``            here; ``scorer`` in hnce.encoders.scorers
negatives  sampler, K, sharing, per-sampler options         here
loss       contrastive loss and its options                here (built by hnce.mining.losses)
training   DeepSpeed optimisation under Ray Train          here
refresh    the asynchronous refresh                        hnce.cluster.compute.refresh
index      FAISS shards, device, retention                 hnce.cluster.stores.sharded_index
cluster    where Ray runs                                  hnce.cluster.compute.session
eval       recall@k                                        here
rerank     the joint reranker (its own ``training``)       here
demo       the WordNet demo subset                         here
blink      ``finetune-blink`` inputs                       here
=========  ==============================================  ===============================

Every error is a :class:`ConfigError` naming the dotted key and, for keys from a file, the file
and line: unknown keys, wrong types, values out of range, duplicate keys (both lines), and the
cross-field rules of :func:`validate` (e.g. a scorer mined exactly, ``ScorerConfig.mining``, with
an approximate ``index.kind``).

Example::

    config = load_config(Path("configs/demo.yaml"), ["training.steps=200", "negatives.sampler=hard"])
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import field
from pathlib import Path, PurePath
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, StrictInt, TypeAdapter, ValidationError, field_validator

from hnce.cluster.compute.refresh import RefreshSettings
from hnce.cluster.compute.session import ClusterSettings
from hnce.cluster.stores.files import atomic_write_text
from hnce.cluster.stores.sharded_index import IndexSpec, default_nprobe
from hnce.encoders.scorers import ScorerConfig
from hnce.errors import InputError
from hnce.mining.false_negatives import CandidateRules
from hnce.mining.losses import build_loss
from hnce.mining.samplers import SAMPLER_SPECS
from hnce.mining.schedule import SamplerSchedule
from hnce.settings import (
    Flag,
    NonNegativeInt,
    NonNegativeReal,
    PositiveInt,
    PositiveReal,
    Text,
    settings,
)

#: ``training.cores``: who runs on a node's cores while training (:mod:`hnce.pipeline.train.cores`)
CoresMode = Literal["auto", "handover", "reserved"]


class ConfigError(InputError):
    """A malformed configuration; the message names the offending key (and file:line)."""


@settings
class RunSettings:
    """Where a run lives (``<dir>/checkpoints``, ``index``, ``negatives``, logs) and its seed."""

    dir: Text = "runs/default"
    seed: NonNegativeInt = 0

    @field_validator("dir")
    @classmethod
    def _no_parent_references(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        if ".." in PurePath(value).parts:
            raise ValueError(f"{value!r} must not contain '..' (give the run directory plainly)")
        return value


@settings
class DataSettings:
    """A dataset directory in the Parquet contract (docs/stores.md) and the splits used."""

    root: Text = "data/wordnet"
    train_split: Text = "train"
    eval_split: Text = "test"
    max_train_mentions: NonNegativeInt = 0  # 0 = all
    max_eval_mentions: NonNegativeInt = 0  # 0 = all


@settings
class ModelSettings:
    """Encoder towers: ``minilm`` (the PyPI-packaged all-MiniLM-L6-v2) or a local model directory.

    ``pooling`` is the first vector x_1 / y_1 of both towers (``hnce.encoders.pooling``): auto (what the
    model directory declares: sentence-transformers' ``modules.json``, [CLS] without one; a
    bi-encoder export's own) | cls | mean. ``normalize`` L2-normalises every vector of both
    towers, so scores are cosines (``BiEncoder.encode_with``; pair it with
    ``loss.options.temperature``, e.g. 0.05 as sentence-transformers' scale 20): unset, a fresh
    model is unnormalised (eq. 9 as the paper writes it) and an export keeps its own.
    ``activation_checkpointing`` recomputes each tower's layer activations in the backward pass
    instead of keeping them (memory for time). ``projection_size`` puts one learned linear layer
    after each tower (ColBERT's 128-d projection of every token vector, BLINK's
    ``additional_linear``; eq. 20 of docs/math.md), both starting from one random draw (as the
    towers start from one model) and trained with the towers and exported with them: index vectors then have that many dimensions, which is what makes sum-of-max and
    multi-m token vectors cheap to store and to compress (``index.kind: ivfpq``). Unset, vectors
    keep the tower's width; a bi-encoder export keeps its own projection. ``shared_towers``
    makes the mention and entity towers (and projections) one module, as sentence-transformers
    and Tevatron train by default (BLINK and DPR train two): half the parameters to update and
    hold, the same matmuls per step. Unset, a fresh model has two towers and a bi-encoder export
    keeps its own.
    """

    path: Text = "minilm"
    mention_length: Annotated[StrictInt, Field(ge=4)] = 32
    entity_length: Annotated[StrictInt, Field(ge=2)] = 64
    pooling: Literal["auto", "cls", "mean"] = "auto"
    normalize: Flag | None = None
    activation_checkpointing: Flag = False
    projection_size: PositiveInt | None = None
    shared_towers: Flag | None = None
    scorer: ScorerConfig = field(default_factory=ScorerConfig)


_NEGATIVES_DOC = """Negative sampling (docs/math.md): K negatives per mention from ``sampler``.

    ``source: index`` mines candidates from the newest refreshed index version (the asynchronous
    refresh of docs/refresh.md); ``source: none`` uses only samplers that need no candidates.
    Before the first refresh the trainer draws from negatives version 0 as ``initial`` says:
    ``random`` (no version 0), ``lexical`` (BM25 candidates, DPR's BM25 negatives) or ``model``
    (mined with the starting model through the encoder actors). With ``refresh.enabled: false``
    version 0 is all the run trains on: negatives mined once (sentence-transformers'
    ``mine_hard_negatives``). ``share``: score each mention against its own candidates (none),
    every candidate of the micro-batch but its known positives (batch), or of every worker's
    micro-batch (global: indexable scorers only; the retriever only, the reranker always scores
    its own candidates). Each sampler with options reads its own group, ``negatives.<name>``
    (declared beside the sampler, :data:`hnce.mining.samplers.SAMPLER_SPECS`). ``candidates``:
    which mined candidates the samplers that read them may draw (margins below the gold, a rank
    window, the reranker's denoising; ``hnce.mining.false_negatives.CandidateRules``);
    ``schedule``: sampler options as functions of the step (``hnce.mining.schedule``).
    """


def _negatives_section() -> type:
    """:class:`NegativesSettings`: the fixed keys, then one option group per sampler that has
    options, from the samplers' specs."""
    groups = [
        (spec.group, spec.options, field(default_factory=spec.options))
        for spec in SAMPLER_SPECS.values()
        if spec.options is not None
    ]
    fields = [
        ("sampler", Literal[tuple(SAMPLER_SPECS)], "mixed"),
        ("num_negatives", PositiveInt, 8),
        ("source", Literal["index", "none"], "index"),
        ("share", Literal["none", "batch", "global"], "none"),
        ("initial", Literal["random", "lexical", "model"], "random"),
        ("filter_false_negatives", Flag, True),
        ("candidates", CandidateRules, field(default_factory=CandidateRules)),
        ("schedule", SamplerSchedule, field(default_factory=SamplerSchedule)),
        *groups,
    ]
    section = dataclasses.make_dataclass(
        "NegativesSettings", fields, namespace={"__doc__": _NEGATIVES_DOC, "__module__": __name__}
    )
    return settings(section)


NegativesSettings = _negatives_section()


@settings
class LossSettings:
    """Contrastive loss (docs/math.md): nce (eq. 5/11) | sampled-softmax | binary-nce | ..."""

    name: Text = "nce"
    options: dict[str, Any] = field(default_factory=dict)


@settings
class TrainingSettings:
    """DeepSpeed optimisation under Ray Train (paper §6.3: Adam, hard-negative NCE).

    ``steps`` counts optimizer steps, each of ``gradient_accumulation`` micro-batches of
    ``batch_size`` mentions per worker. ``candidate_chunk_size`` (0: off) encodes a micro-batch's
    candidates in chunks whose activations are recomputed in the backward pass, so the number of
    negatives is not bounded by activation memory. ``on_nonfinite``: what a NaN or infinite
    training loss does: ``stop`` training at that step with the cause (the default) or ``warn``
    and go on; a checkpoint whose weights are not finite is never published either way.
    ``cores``: ``reserved`` runs every worker on ``cpus_per_worker`` threads; ``handover`` on
    every core of its node while no refresh of the run is encoding or mining, and on
    ``cpus_per_worker`` while one is; ``auto``: ``handover`` on a one-node CPU cluster, else
    ``reserved`` (:mod:`hnce.pipeline.train.cores`).
    """

    steps: PositiveInt = 1000
    batch_size: PositiveInt = 16
    gradient_accumulation: PositiveInt = 1
    learning_rate: PositiveReal = 2e-5
    warmup_steps: NonNegativeInt = 100
    weight_decay: NonNegativeReal = 0.0
    max_grad_norm: PositiveReal = 1.0
    zero_stage: Literal[0, 1, 2, 3] = 0
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    num_workers: PositiveInt = 2
    cpus_per_worker: PositiveReal = 1.0
    checkpoint_every: PositiveInt = 100
    negatives_check_every: PositiveInt = 10
    keep_checkpoints: PositiveInt = 3
    max_failures: NonNegativeInt = 2
    log_every: PositiveInt = 10
    candidate_chunk_size: NonNegativeInt = 0
    on_nonfinite: Literal["stop", "warn"] = "stop"
    cores: CoresMode = "auto"


@settings
class EvalSettings:
    """Recall@k against the whole catalogue through the index; accuracy = recall@1."""

    ks: list[PositiveInt] = Field(default_factory=lambda: [1, 8, 64, 100], min_length=1)
    batch_size: PositiveInt = 256
    per_domain_catalogue: Flag = False  # Zeshel: link each mention within its own domain


# Where the reranker's training defaults differ from the retriever's: a cross-encoder pays one
# BERT pass per (mention, candidate) pair, so 2 mentions x 64 candidates fill one worker.
_RERANKER_TRAINING = {"batch_size": 2, "num_workers": 1}


def _reranker_training() -> TrainingSettings:
    return TrainingSettings(**_RERANKER_TRAINING)


@settings
class RerankSettings:
    """``hnce rerank``: the joint cross-encoder trained on a fixed retriever's top candidates.

    ``candidates``: ``negatives`` (the run's newest negatives version of each split; mine dev/test
    by listing them in ``refresh.splits``) or ``retriever`` (search ``retriever``, a bi-encoder
    export directory or ``newest``, in the run's index version of that checkpoint, built if none).
    Training runs through the same driver as ``hnce train`` under ``<run.dir>/rerank``, with its
    own ``training`` settings (``training.candidate_chunk_size`` chunks the scored pairs) and
    ``activation_checkpointing`` for the encoder. ``hnce rerank --denoise`` also flags the train
    candidates the trained reranker scores above the gold's score minus ``denoise_margin``
    (RocketQA's denoising, read back by ``negatives.candidates.denoised``).
    """

    model: Text = "minilm"
    candidates: Literal["negatives", "retriever"] = "negatives"
    retriever: Text = "newest"
    num_candidates: Annotated[StrictInt, Field(ge=2)] = 64
    mention_length: Annotated[StrictInt, Field(ge=4)] = 32
    entity_length: Annotated[StrictInt, Field(ge=2)] = 128
    eval_splits: list[Text] = Field(default_factory=lambda: ["dev", "test"])
    eval_batch_size: PositiveInt = 4
    max_train_mentions: NonNegativeInt = 0
    max_eval_mentions: NonNegativeInt = 0
    activation_checkpointing: Flag = False
    denoise_margin: NonNegativeReal = 0.0
    training: TrainingSettings = field(default_factory=_reranker_training)

    @field_validator("training", mode="before")
    @classmethod
    def _reranker_defaults(cls, value: Any) -> Any:
        """A partial ``rerank.training`` keeps the reranker's defaults for the keys it omits."""
        return {**_RERANKER_TRAINING, **value} if isinstance(value, Mapping) else value


@settings
class DemoSettings:
    """``hnce demo``: the WordNet subset it trains and evaluates on (see configs/demo.yaml).

    The catalogue holds ``catalogue_entities`` synsets (0: all 117,659): every gold, then the
    other senses of the golds' lemmas (the ambiguous senses, the hard distractors; held-out
    mentions first), then random synsets.

    ``curve_every``: besides its final checkpoint, each training run's checkpoints at every
    ``curve_every`` steps are evaluated after it, so the demo prints and plots recall against
    wall-clock (0: the final checkpoint only). A multiple of ``training.checkpoint_every`` whose
    checkpoints the run keeps (``training.keep_checkpoints``); ``hnce demo`` checks both.
    """

    wordnet_dir: Text = "/usr/share/wordnet"
    catalogue_entities: NonNegativeInt = 10000
    train_mentions: NonNegativeInt = 2000
    eval_mentions: NonNegativeInt = 500
    curve_every: NonNegativeInt = 0


@settings
class BlinkSettings:
    """``hnce finetune-blink`` inputs (docs/input-formats.md); the command's flags set the same keys.

    ``checkpoint``: BLINK bi-encoder state_dict; ``base_model``: local HF directory with the BERT
    config and vocabulary; one catalogue (``entities``: BLINK entity.jsonl, or
    ``knowledge_source``: kilt_knowledgesource.json); ``encodings``: all_entities_large.t7 (index
    version 0 without re-encoding); ``aida``: the KILT AIDA files.
    """

    checkpoint: Text | None = None
    base_model: Text | None = None
    entities: Text | None = None
    knowledge_source: Text | None = None
    encodings: Text | None = None
    aida: list[Text] = Field(default_factory=list)
    max_text_chars: PositiveInt = 2000


@settings
class Config:
    """A whole recipe: one section per concern."""

    run: RunSettings = field(default_factory=RunSettings)
    data: DataSettings = field(default_factory=DataSettings)
    model: ModelSettings = field(default_factory=ModelSettings)
    negatives: NegativesSettings = field(default_factory=NegativesSettings)
    loss: LossSettings = field(default_factory=LossSettings)
    training: TrainingSettings = field(default_factory=TrainingSettings)
    refresh: RefreshSettings = field(default_factory=RefreshSettings)
    index: IndexSpec = field(default_factory=IndexSpec)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    eval: EvalSettings = field(default_factory=EvalSettings)
    rerank: RerankSettings = field(default_factory=RerankSettings)
    demo: DemoSettings = field(default_factory=DemoSettings)
    blink: BlinkSettings = field(default_factory=BlinkSettings)

    @property
    def run_dir(self) -> Path:
        return Path(self.run.dir)

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (YAML/JSON-serialisable); ``config_from_dict`` inverts it."""
        return dataclasses.asdict(self)

    def where(self, key: str) -> str:
        """``file:line`` (or ``--set ...``) a dotted key came from, for error messages."""
        return _where(key, getattr(self, "_origins", {}))

    def error(self, key: str, message: str) -> ConfigError:
        """A :class:`ConfigError` about ``key``, naming where it was set."""
        return ConfigError(f"{self.where(key)}: '{key}' {message}")


_CONFIG = TypeAdapter(Config)


# --------------------------------------------------------------------------------------------
# Loading


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
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte {error.start})") from None


def _yaml_error(path: Path, error: yaml.YAMLError) -> ConfigError:
    """``file:line: problem`` for a YAML error (the line of its mark, when it has one)."""
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
    problem = getattr(error, "problem", None) or str(error)
    return ConfigError(f"{where}: not valid YAML: {problem}")


def read_recipe(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The recipe's tree and the origin (``file:line``) of each dotted key."""
    loader = _RecipeLoader(_recipe_text(path))
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


def _where(key: str, origins: Mapping[str, str]) -> str:
    """The origin of ``key``, else of a key inside it (``loss`` → ``loss.name``), else of its
    nearest parent section, else of the recipe."""
    if key in origins:
        return origins[key]
    inside = [origin for name, origin in origins.items() if name.startswith(key + ".")]
    if inside:
        return inside[0]
    parts = key.split(".")
    for end in range(len(parts) - 1, 0, -1):
        found = origins.get(".".join(parts[:end]))
        if found:
            return found
    return origins.get("") or "config"


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


def _dotted(location: Sequence[int | str]) -> str:
    key = ""
    for part in location:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
    return key


def _errors(error: ValidationError, origins: Mapping[str, str]) -> ConfigError:
    """One :class:`ConfigError` listing every problem pydantic found, each with its origin."""
    lines = []
    for problem in error.errors(include_url=False):
        key = _dotted(problem["loc"])
        where = _where(key.split("[")[0], origins)
        message = problem["msg"].removeprefix("Value error, ")
        if problem["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
            lines.append(f"{where}: unknown key '{key}'")
            continue
        value = problem.get("input")
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        lines.append(f"{where}: '{key}': {message}{shown}")
    return ConfigError("\n".join(lines))


def validate(config: Config) -> Config:
    """Cross-field rules a field's type cannot express; raise ``ConfigError`` naming the keys."""
    negatives, refresh = config.negatives, config.refresh
    if config.model.scorer.mining == "exact" and config.index.kind != "flat":
        raise config.error(
            "index.kind",
            f"is {config.index.kind!r}, but scorer {config.model.scorer.name!r} is mined and "
            f"evaluated exactly (its query depends on the entity, docs/math.md): its shards "
            f"store reduced entity vectors, which only a flat index keeps exactly; set index.kind: flat",
        )
    if config.model.scorer.name == "som" and config.index.kind == "hnsw":
        raise config.error(
            "index.kind",
            "is 'hnsw', but sum-of-max rescores its candidates from their token vectors, which "
            "hnce reads from a flat index or decodes from an ivfpq one, not from HNSW; set index.kind: flat (exact) "
            "or ivfpq (compressed, docs/engines.md)",
        )
    if config.index.token_copy and (
        config.model.scorer.name != "som" or config.index.kind != "ivfpq"
    ):
        raise config.error(
            "index.token_copy",
            f"is true, but it chooses what a compressed sum-of-max shard rescores from (index.kind "
            f"ivfpq, scorer som), and this recipe has scorer {config.model.scorer.name!r} over "
            f"{config.index.kind!r} (flat shards rescore from their own vectors; compressed "
            f"multi-m always keeps its copy); set index.token_copy: false",
        )
    if config.index.nprobe is None:
        config.index.nprobe = default_nprobe(
            config.index.nlist, config.model.scorer.name == "multi"
        )
    if negatives.share == "global" and not config.model.scorer.indexable:
        raise config.error(
            "negatives.share",
            f"is 'global', which gathers the entity side of the score across workers, but "
            f"'model.scorer.name' is {config.model.scorer.name!r}, whose score is not split into "
            f"a mention side and an entity side (not indexable, docs/math.md); use share 'batch' "
            f"or 'none', or a dual, multi or som scorer",
        )
    _validate_samplers(config)
    if refresh.mode == "sync" and (negatives.source != "index" or not refresh.enabled):
        raise config.error(
            "refresh.mode",
            "is sync, which waits for refreshed negatives: it needs 'negatives.source: index' "
            "and 'refresh.enabled: true'",
        )
    if refresh.trigger == "stale" and refresh.mode != "async":
        raise config.error(
            "refresh.trigger",
            "is stale, which asks the asynchronous coordinator for refreshes: it needs "
            "'refresh.mode: async' (sync refreshes every 'refresh.sync_every' steps)",
        )
    if refresh.top_n < negatives.num_negatives:
        raise config.error(
            "refresh.top_n",
            f"({refresh.top_n}) must be at least 'negatives.num_negatives' "
            f"({negatives.num_negatives})",
        )
    if negatives.source == "index" and config.data.train_split not in refresh.splits:
        raise config.error(
            "refresh.splits",
            f"{refresh.splits} must include the train split {config.data.train_split!r}",
        )
    try:
        build_loss(config.loss.name, **config.loss.options)
    except ValueError as error:
        raise config.error("loss", f"(name / options): {error}") from error
    if config.training.precision == "bf16" and not config.cluster.use_gpu:
        raise config.error(
            "training.precision", "is bf16, which needs GPUs ('cluster.use_gpu: true')"
        )
    if config.model.shared_towers and config.training.zero_stage == 3:
        raise config.error(
            "model.shared_towers",
            "with training.zero_stage 3 is not supported (one tower registered twice under "
            "ZeRO-3's partitioned weights is untested here); use ZeRO 0, 1 or 2",
        )
    if config.cluster.gpu_sharing != "auto" and not config.cluster.use_gpu:
        raise config.error(
            "cluster.gpu_sharing",
            f"is {config.cluster.gpu_sharing}, which needs GPUs ('cluster.use_gpu: true')",
        )
    return config


def _validate_samplers(config: Config) -> None:
    """What the chosen sampler's spec asks of the rest of the recipe."""
    negatives = config.negatives
    spec = SAMPLER_SPECS[negatives.sampler]
    name = negatives.sampler
    if spec.candidates == "index" and negatives.source != "index":
        raise config.error(
            "negatives.sampler",
            f"{name!r} mines from an index but 'negatives.source' is {negatives.source!r}",
        )
    if spec.candidates == "index" and not (config.refresh.enabled or negatives.initial != "random"):
        raise config.error(
            "negatives.sampler",
            f"{name!r} needs mined negatives but 'refresh.enabled' is false and "
            f"'negatives.initial' is random",
        )
    if spec.candidates == "lexical" and negatives.source != "none":
        raise config.error(
            "negatives.sampler",
            f"is {name}, which needs no index, but 'negatives.source' is {negatives.source!r}: "
            f"set it to none, or start an index run from BM25 with 'negatives.initial: lexical'",
        )
    if negatives.initial != "random" and negatives.source != "index":
        raise config.error(
            "negatives.initial",
            f"is {negatives.initial} (negatives version 0) but 'negatives.source' is none",
        )
    for check in (group.check for group in SAMPLER_SPECS.values() if group.check is not None):
        problem = check(negatives)
        if problem is not None:
            raise config.error(*problem)
    _validate_candidate_rules(config)
    _validate_schedule(config)
    scorer = config.model.scorer
    if spec.loss_columns is not None and scorer.name != "dual":
        raise config.error(
            "model.scorer.name",
            f"is {scorer.name!r}; the {name!r} sampler adds one vector per entity to the loss, "
            f"which only the dual scorer reads",
        )
    if spec.scores_online and config.training.zero_stage == 3:
        raise config.error(
            "training.zero_stage",
            f"is 3, whose partitioned weights cannot score outside the engine's forward, which "
            f"{name!r} does; use 0, 1 or 2",
        )


def _validate_candidate_rules(config: Config) -> None:
    """``negatives.candidates`` needs a sampler that draws from scored candidates, and a rank
    window that starts inside the mined depth."""
    negatives = config.negatives
    rules, name = negatives.candidates, negatives.sampler
    if SAMPLER_SPECS[name].candidates == "none":
        for key in ("absolute_margin", "relative_margin", "rank_window"):
            if getattr(rules, key) is not None:
                raise config.error(
                    f"negatives.candidates.{key}",
                    f"is set, but sampler {name!r} draws from no scored candidates (only the "
                    f"samplers of an index or BM25 do); remove it or pick such a sampler",
                )
        if rules.denoised:
            raise config.error(
                "negatives.candidates.denoised",
                f"is true, but sampler {name!r} draws from no mined candidates",
            )
    depth = negatives.lexical.top_n if negatives.source == "none" else config.refresh.top_n
    if rules.rank_window is not None and rules.rank_window[0] >= depth:
        raise config.error(
            "negatives.candidates.rank_window",
            f"starts at rank {rules.rank_window[0]}, but each mention has only {depth} mined "
            f"candidates ('refresh.top_n', or 'negatives.lexical.top_n' for BM25)",
        )


def _validate_schedule(config: Config) -> None:
    """Each scheduled option must be a field of the chosen sampler."""
    name = config.negatives.sampler
    sampler = SAMPLER_SPECS[name].sampler
    fields = (
        {f.name for f in dataclasses.fields(sampler)}
        if dataclasses.is_dataclass(sampler)
        else set()
    )
    for option in config.negatives.schedule.scheduled:
        if option not in fields:
            raise config.error(
                f"negatives.schedule.{option}",
                f"is scheduled, but sampler {name!r} has no option {option!r} to schedule",
            )


def _non_finite(tree: Any, key: str = "") -> str | None:
    """The dotted key of the first non-finite number in ``tree`` (typed settings refuse them
    themselves; this also covers free-form groups such as ``loss.options``)."""
    if isinstance(tree, float) and not math.isfinite(tree):
        return key
    children = (
        tree.items()
        if isinstance(tree, Mapping)
        else enumerate(tree)
        if isinstance(tree, list)
        else ()
    )
    for name, value in children:
        found = _non_finite(value, f"{key}.{name}" if key else str(name))
        if found is not None:
            return found
    return None


def config_from_dict(tree: Mapping[str, Any], origins: Mapping[str, str] | None = None) -> Config:
    """Build and validate a :class:`Config` from a nested mapping."""
    origins = dict(origins or {})
    bad = _non_finite(tree)
    if bad is not None:
        raise ConfigError(f"{_where(bad, origins)}: '{bad}' must be a finite number")
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
