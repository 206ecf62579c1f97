"""The settings tree: :class:`Config` and the sections declared here (run, data, model, negatives,
loss, training, eval, rerank, demo, blink), composed with those declared beside their consumers
(refresh, index, cluster, ``model.scorer``; see :mod:`hnce.pipeline.config`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path, PurePath
from typing import Annotated, Any, Literal

from pydantic import Field, StrictInt, field_validator

from hnce.cluster.compute.refresh import RefreshSettings
from hnce.cluster.compute.session import ClusterSettings
from hnce.cluster.stores.sharded_index import IndexSpec
from hnce.encoders.scorers import ScorerConfig
from hnce.mining.false_negatives import CandidateRules
from hnce.mining.negative_cache import NegativeCacheOptions
from hnce.mining.samplers import SAMPLER_SPECS
from hnce.mining.schedule import SamplerSchedule
from hnce.pipeline.config.origins import ConfigError, origin_of
from hnce.settings import (
    Flag,
    Fraction,
    NonNegativeInt,
    NonNegativeReal,
    PositiveInt,
    PositiveReal,
    Text,
    settings,
)

#: ``training.cores``: who runs on a node's cores while training (:mod:`hnce.pipeline.train.cores`)
CoresMode = Literal["auto", "handover", "reserved"]
#: ``training.keep_deepspeed_state``: which checkpoints keep their DeepSpeed state
DeepSpeedStateKept = Literal["all", "newest"]


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
    towers, so scores are cosines (``BiEncoder.encode_with``; the loss's temperature then
    defaults to 0.05, sentence-transformers' scale 20): unset, a fresh model is normalised (the
    measured default; false: eq. 9's inner product as the paper writes it) and an export keeps
    its own.
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
    entity_length: Annotated[StrictInt, Field(ge=2)] = 32
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
    (mined with the starting model through the encoder actors). With the negative cache,
    ``random`` (the measured default) fills the cache from the steps alone: no pass over the
    catalogue before training, at random's price. With ``refresh.enabled: false``
    version 0 is all the run trains on: negatives mined once (sentence-transformers'
    ``mine_hard_negatives``). ``share``: score each mention against its own candidates (none),
    every candidate of the micro-batch but its known positives (batch), or of every worker's
    micro-batch (global: indexable scorers only; the retriever only, the reranker always scores
    its own candidates). Each sampler with options reads its own group, ``negatives.<name>``
    (declared beside the sampler, :data:`hnce.mining.samplers.SAMPLER_SPECS`). ``candidates``:
    which mined candidates the samplers that read them may draw (margins below the gold, a rank
    window, the reranker's denoising; ``hnce.mining.false_negatives.CandidateRules``);
    ``schedule``: sampler options as functions of the step (``hnce.mining.schedule``);
    ``cache``: draw those candidates from the trainer's negative cache instead of the mined
    lists (``hnce.mining.negative_cache``). ``positive_aware`` f: a candidate of the loss (mined,
    cached, shared or a whole-catalogue column) scored above f times its mention's gold score
    under the current weights is dropped as a likely unlabelled positive (NV-Retriever's
    TopK-PercPos, ``hnce.mining.losses.positive_aware``; None: none dropped).
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
        ("share", Literal["none", "batch", "global"], "batch"),
        ("initial", Literal["random", "lexical", "model"], "random"),
        ("filter_false_negatives", Flag, True),
        ("positive_aware", Fraction | None, None),
        ("candidates", CandidateRules, field(default_factory=CandidateRules)),
        ("schedule", SamplerSchedule, field(default_factory=SamplerSchedule)),
        ("cache", NegativeCacheOptions, field(default_factory=NegativeCacheOptions)),
        *groups,
    ]
    section = dataclasses.make_dataclass(
        "NegativesSettings", fields, namespace={"__doc__": _NEGATIVES_DOC, "__module__": __name__}
    )
    return settings(section)


NegativesSettings = _negatives_section()


@settings
class LossSettings:
    """Contrastive loss (docs/math.md): nce (eq. 5/11) | sampled-softmax | binary-nce | ...
    ``options`` are the loss's own arguments; a loss with a ``temperature`` that ``options``
    leaves unset divides cosine scores (``model.normalize``) by 0.05 and inner products by 1
    (:func:`hnce.mining.losses.default_options`)."""

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
    ``reserved`` (:mod:`hnce.pipeline.train.cores`). ``keep_deepspeed_state``: which of the
    ``keep_checkpoints`` checkpoints keep their DeepSpeed state (model and optimizer, most of a
    checkpoint's bytes): ``all``, or only the ``newest``, the one training resumes from; the
    older ones keep their export, which refreshes, evaluation and ``hnce export`` read
    (:func:`hnce.cluster.stores.checkpoints.slim_checkpoints`).
    """

    steps: PositiveInt = 1000
    batch_size: PositiveInt = 8
    gradient_accumulation: PositiveInt = 1
    learning_rate: PositiveReal = 1e-4
    warmup_steps: NonNegativeInt = 6
    weight_decay: NonNegativeReal = 0.0
    max_grad_norm: PositiveReal = 1.0
    zero_stage: Literal[0, 1, 2, 3] = 0
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    num_workers: PositiveInt = 1
    cpus_per_worker: PositiveReal = 1.0
    checkpoint_every: PositiveInt = 100
    negatives_check_every: PositiveInt = 10
    keep_checkpoints: PositiveInt = 3
    keep_deepspeed_state: DeepSpeedStateKept = "all"
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
# BERT pass per (mention, candidate) pair, so 2 mentions x 64 candidates fill one worker; it keeps
# BERT's fine-tuning rate and warm-up (the retriever's were measured on the bi-encoder only).
_RERANKER_TRAINING = {
    "batch_size": 2,
    "num_workers": 1,
    "learning_rate": 2e-5,
    "warmup_steps": 100,
}


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

    ``train_mentions`` sampled training mentions; held out, ``seen_eval_mentions`` other example
    sentences of synsets a training mention links to and ``unseen_eval_mentions`` of synsets none
    does (:mod:`hnce.pipeline.data.demo_subset`); recall is reported apart for the two. The
    catalogue holds ``catalogue_entities`` synsets (0: all 117,659): every gold, then the other
    senses of the golds' lemmas (the ambiguous senses, the hard distractors; held-out mentions
    first), then random synsets.

    ``curve_every``: besides its final checkpoint, each training run's checkpoints at every
    ``curve_every`` steps are evaluated after it, so the demo prints and plots recall against
    wall-clock (0: the final checkpoint only). A multiple of ``training.checkpoint_every`` whose
    checkpoints the run keeps (``training.keep_checkpoints``); ``hnce demo`` checks both.
    """

    wordnet_dir: Text = "/usr/share/wordnet"
    catalogue_entities: NonNegativeInt = 10000
    train_mentions: NonNegativeInt = 1000
    seen_eval_mentions: NonNegativeInt = 2000
    unseen_eval_mentions: NonNegativeInt = 2000
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
        return origin_of(key, getattr(self, "_origins", {}))

    def error(self, key: str, message: str) -> ConfigError:
        """A :class:`ConfigError` about ``key``, naming where it was set."""
        return ConfigError(f"{self.where(key)}: '{key}' {message}")
