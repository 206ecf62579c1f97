"""The settings tree: :class:`Config` and the sections declared here (run, data, model, negatives,
loss, training, eval, rerank, demo, blink), composed with those declared beside their consumers
(refresh, index, cluster, ``model.scorer``; see :mod:`hnce.pipeline.config`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from pathlib import Path, PurePath
from typing import Annotated, Any, Literal

from pydantic import Field, StrictInt, field_validator

from hnce.cluster.compute.refresh.settings import RefreshSettings
from hnce.cluster.compute.session import ClusterSettings
from hnce.cluster.stores.index_spec import IndexSpec
from hnce.encoders.scorers import ScorerConfig
from hnce.mining.false_negatives import CandidateRules
from hnce.mining.losses import LOSSES
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
    section_with_groups,
    settings,
)

#: ``training.cores``: who runs on a node's cores while training (:mod:`hnce.pipeline.train.cores`)
CoresMode = Literal["auto", "handover", "reserved"]
#: ``training.keep_deepspeed_state``: which checkpoints keep their DeepSpeed state
DeepSpeedStateKept = Literal["all", "newest"]


@settings
class RunSettings:
    """Where a run lives and its seed.

    Attributes:
        dir: the run directory: its ``checkpoints/``, ``index/``, ``negatives/`` and logs (no
            ``..`` in it).
        seed: seeds every random draw of the run: the order of the mentions, the negatives and
            dropout, step by step, so a resumed run draws what an uninterrupted one would.
    """

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
    """A dataset directory in the Parquet contract (docs/stores.md) and the splits used.

    Attributes:
        root: the dataset directory (what ``hnce data ... --out`` wrote).
        train_split: the split training reads, every mention of it.
        eval_split: the split ``hnce eval`` and each refresh's held-out recall score.
        max_eval_mentions: evaluate on the first this many mentions of ``eval_split`` (and of
            each of ``rerank.eval_splits``); 0: all.
    """

    root: Text = "data/wordnet"
    train_split: Text = "train"
    eval_split: Text = "test"
    max_eval_mentions: NonNegativeInt = 0


@settings
class ModelSettings:
    """The encoder towers (docs/encoders.md) and, in ``scorer``, the score function.

    Attributes:
        path: ``minilm`` (the PyPI-packaged all-MiniLM-L6-v2), a local model directory or a
            bi-encoder export.
        mention_length: tokens of a mention with its context, for the retriever and the
            reranker.
        entity_length: tokens of an entity's title and text, for the retriever and the reranker.
        pooling: the first vector x_1 / y_1 of both towers (``hnce.encoders.pooling``): ``auto``
            (what the model directory declares: sentence-transformers' ``modules.json``, [CLS]
            without one; a bi-encoder export's own), ``cls`` or ``mean``.
        normalize: L2-normalise every vector of both towers, so scores are cosines
            (``BiEncoder.encode_with``; ``loss.temperature`` then defaults to 0.05,
            sentence-transformers' scale 20). Unset, a fresh model is normalised (the measured
            default; false: eq. 9's inner product as the paper writes it) and an export keeps
            its own.
        activation_checkpointing: recompute the layer activations of each tower, and of the
            reranker's encoder, in the backward pass instead of keeping them (memory for time).
        projection_size: one learned linear layer after each tower (ColBERT's 128-d projection
            of every token vector, BLINK's ``additional_linear``; eq. 20 of docs/math.md), both
            starting from one random draw and trained and exported with the towers: index
            vectors then have that many dimensions, which makes sum-of-max and multi-m token
            vectors cheap to store and to compress (``index.kind: ivfpq``). Unset, vectors keep
            the tower's width; a bi-encoder export keeps its own projection.
        shared_towers: one module for the mention and entity towers (and projections), as
            sentence-transformers and Tevatron train by default (BLINK and DPR train two): half
            the parameters to update and hold, the same matmuls per step. Unset, a fresh model
            has two towers and a bi-encoder export keeps its own.
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


_NEGATIVES_DOC = """Negative sampling (docs/negatives.md, docs/math.md): K negatives per mention.

    Each sampler with options reads its own group, ``negatives.<name>`` (declared beside the
    sampler, :data:`hnce.mining.samplers.SAMPLER_SPECS`); ``candidates`` says which mined
    candidates they may draw, ``schedule`` sets their options by step and ``cache`` draws the
    candidates from the trainer's negative cache.

    Attributes:
        sampler: what draws each mention's negatives (docs/negatives.md's table of samplers).
        num_negatives: K, the negatives drawn per mention.
        source: ``index`` mines candidates from the newest refreshed index version (the
            asynchronous refresh of docs/refresh.md); ``none`` uses only samplers that need no
            candidates.
        share: which candidates a mention is scored against: its own (``none``), every
            candidate of the micro-batch but its known positives (``batch``), or of every
            worker's micro-batch (``global``: indexable scorers only). The retriever only: the
            reranker always scores its own candidates.
        initial: the initial negatives, what the trainer draws from before the first refresh:
            ``random`` (none), ``lexical`` (BM25 candidates, DPR's BM25 negatives) or ``model``
            (mined with the starting model through the encoder actors). With the negative cache,
            ``random`` (the measured default) fills the cache from the steps alone: no pass over
            the catalogue before training, at random's price. With ``refresh.enabled: false``
            they are all the run trains on: negatives mined once (sentence-transformers'
            ``mine_hard_negatives``).
        filter_false_negatives: never draw any known positive of a mention (its ``golds``,
            eq. 52) as its negative; false: only its gold is left out.
        positive_aware: f: a candidate of the loss (mined, cached, shared or a whole-catalogue
            column) scored above f times its mention's gold score under the current weights is
            dropped as a likely unlabelled positive (NV-Retriever's TopK-PercPos,
            ``hnce.mining.losses.positive_aware``); unset: none is dropped.
    """


def _negatives_section() -> type:
    """:class:`NegativesSettings`: the fixed keys, then one option group per sampler that has
    options, from the samplers' specs."""
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
    ]
    return section_with_groups(
        "NegativesSettings", _NEGATIVES_DOC, __name__, fields, SAMPLER_SPECS.values()
    )


NegativesSettings = _negatives_section()


@settings
class LossSettings:
    """The contrastive loss (docs/math.md, §4); its arguments other than ``temperature``
    (triplet's margin, focal's gamma, ...) keep their defaults in a recipe.

    Attributes:
        name: nce (eq. 5/11) | sampled-softmax (eq. 10) | binary-nce | negative-sampling |
            triplet | focal.
        temperature: τ that nce, sampled-softmax and focal divide the scores by (not the hard
            sampler's ``negatives.hard.sampling_temperature``); unset, 0.05 for cosine scores
            (``model.normalize``) and 1 for inner products
            (:func:`hnce.mining.losses.loss_options`).
    """

    name: Text = "nce"
    temperature: PositiveReal | None = None

    @field_validator("name")
    @classmethod
    def _known_loss(cls, name: str) -> str:
        if name not in LOSSES:
            raise ValueError(f"unknown loss {name!r}; known: {', '.join(LOSSES)}")
        return name


@settings
class TrainingSettings:
    """DeepSpeed optimisation under Ray Train (paper §6.3: Adam, hard-negative NCE), no weight
    decay (:func:`hnce.pipeline.train.deepspeed_config.build_deepspeed_config`).

    Attributes:
        steps: optimizer steps, each of ``gradient_accumulation`` micro-batches of
            ``batch_size`` mentions per worker.
        batch_size: mentions of a micro-batch, per worker.
        gradient_accumulation: micro-batches an optimizer step sums.
        learning_rate: Adam's peak rate, reached after ``warmup_steps`` and decayed linearly to
            0 at ``steps``.
        warmup_steps: steps of linear warm-up from 0 (0: the full rate from the first step).
        max_grad_norm: the gradients' norm is clipped to this before each step.
        zero_stage: DeepSpeed ZeRO stage: 0 none; 1, 2, 3 partition the optimizer state, then
            the gradients, then the weights across the workers.
        precision: ``auto`` (bf16 on a GPU that supports it, else fp32), ``bf16`` or ``fp32``.
        num_workers: Ray Train workers, one process (and GPU, with ``cluster.use_gpu``) each.
        cpus_per_worker: CPUs each worker asks Ray for, and its torch threads while a refresh
            works (``cores``).
        checkpoint_every: steps between checkpoints (each a resume point and, with the
            refresh, a model to re-encode the catalogue with).
        negatives_check_every: steps between the workers' looks for a newer negatives version
            (and at the first step of each start).
        keep_checkpoints: checkpoints kept; older ones are removed after each publication.
        keep_deepspeed_state: which of the kept checkpoints keep their DeepSpeed state (model
            and optimizer, most of a checkpoint's bytes): ``all``, or only the ``newest``, the
            one training resumes from; the older ones keep their export, which refreshes,
            evaluation and ``hnce export`` read
            (:func:`hnce.cluster.stores.checkpoints.slim_checkpoints`).
        max_failures: worker-group failures Ray Train restarts from the newest checkpoint
            before the run fails.
        log_every: steps between ``step`` events (loss, rate and the mention ids trained on;
            the last step always).
        candidate_chunk_size: encode a micro-batch's candidates in chunks of this many whose
            activations are recomputed in the backward pass, so the number of negatives is not
            bounded by activation memory (0: off).
        on_nonfinite: what a NaN or infinite training loss does: ``stop`` training at that step
            with the cause, or ``warn`` and go on; a checkpoint whose weights are not finite is
            never published either way.
        cores: ``reserved`` runs every worker on ``cpus_per_worker`` threads; ``handover`` on
            every core of its node while no refresh of the run is encoding or mining, and on
            ``cpus_per_worker`` while one is; ``auto``: ``handover`` on a one-node CPU cluster,
            else ``reserved`` (:mod:`hnce.pipeline.train.cores`; the driver logs its choice).
    """

    steps: PositiveInt = 1000
    batch_size: PositiveInt = 8
    gradient_accumulation: PositiveInt = 1
    learning_rate: PositiveReal = 1e-4
    warmup_steps: NonNegativeInt = 6
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
    """Recall@k against the whole catalogue through the index (docs/eval.md).

    Attributes:
        ks: the cutoffs k of recall@k reported (accuracy is recall@1).
        per_domain_catalogue: search each mention among its own domain's entities only
            (Zeshel: a test world is linked against that world's documents).
    """

    ks: list[PositiveInt] = Field(default_factory=lambda: [1, 8, 64, 100], min_length=1)
    per_domain_catalogue: Flag = False


@settings
class RerankTrainingSettings:
    """``rerank.training``: where the reranker trains unlike the retriever; every other
    optimisation setting is ``training``'s (:meth:`Config.reranker_training`).

    Attributes:
        steps: the reranker's optimizer steps.
        batch_size: mentions of a micro-batch, per worker, each with its ``num_candidates``: a
            cross-encoder pays one BERT pass per (mention, candidate) pair, so 2 x 64 fill one
            worker. Its scoring outside training takes twice as many.
        learning_rate: BERT's fine-tuning rate (the retriever's was measured on the bi-encoder
            only).
        warmup_steps: BERT's fine-tuning warm-up.
    """

    steps: PositiveInt = 1000
    batch_size: PositiveInt = 2
    learning_rate: PositiveReal = 2e-5
    warmup_steps: NonNegativeInt = 100


@settings
class RerankSettings:
    """``hnce rerank``: the joint cross-encoder trained on a fixed retriever's top candidates.

    Training runs through the same driver as ``hnce train`` under ``<run.dir>/rerank``, with
    ``training``'s settings but for what ``rerank.training`` sets (``training.candidate_chunk_size``
    chunks the scored pairs). The reranker reads each mention and entity at the retriever's
    lengths (``model.mention_length``, ``model.entity_length``; BLINK's cross-encoder reads the
    pair at the bi-encoder's 32 and 128) and recomputes activations as the retriever's towers do
    (``model.activation_checkpointing``); it trains on every train mention with candidates and
    is evaluated on the first ``data.max_eval_mentions`` of each split.

    Attributes:
        model: the encoder the cross-encoder starts from (``minilm`` or a local model
            directory); its scoring head starts random.
        candidates: ``negatives`` (the run's newest negatives version of each split; mine
            dev/test by listing them in ``refresh.splits``) or ``retriever`` (search
            ``retriever`` in the run's index version of that checkpoint, built if none).
        retriever: with ``candidates: retriever``, a bi-encoder export directory or ``newest``
            (the run's newest checkpoint).
        num_candidates: candidates per mention, the gold among them when retrieved (the
            paper's top 64).
        eval_splits: the splits reranked and reported after training.
        denoise_margin: ``hnce rerank --denoise`` flags the train candidates the trained
            reranker scores above the gold's score minus this margin (RocketQA's denoising,
            read back by ``negatives.candidates.denoised``).
    """

    model: Text = "minilm"
    candidates: Literal["negatives", "retriever"] = "negatives"
    retriever: Text = "newest"
    num_candidates: Annotated[StrictInt, Field(ge=2)] = 64
    eval_splits: list[Text] = Field(default_factory=lambda: ["dev", "test"])
    denoise_margin: NonNegativeReal = 0.0
    training: RerankTrainingSettings = field(default_factory=RerankTrainingSettings)


@settings
class DemoSettings:
    """``hnce demo``: the WordNet subset it trains and evaluates on (see configs/demo.yaml;
    :mod:`hnce.pipeline.data.demo_subset`); recall is reported apart for seen and unseen synsets.

    Attributes:
        wordnet_dir: the WordNet database directory (where Debian's ``wordnet`` package puts it).
        catalogue_entities: synsets in the catalogue (0: all 117,659): every gold, then the
            other senses of the golds' lemmas (the ambiguous senses, the hard distractors;
            held-out mentions first), then random synsets.
        train_mentions: sampled training mentions.
        seen_eval_mentions: held out: other example sentences of synsets a training mention
            links to.
        unseen_eval_mentions: held out: example sentences of synsets no training mention links
            to.
        curve_every: besides its final checkpoint, each training run's checkpoints at every
            ``curve_every`` steps are evaluated after it, so the demo prints and plots recall
            against wall-clock (0: the final checkpoint only). A multiple of
            ``training.checkpoint_every`` whose checkpoints the run keeps
            (``training.keep_checkpoints``); ``hnce demo`` checks both.
    """

    wordnet_dir: Text = "/usr/share/wordnet"
    catalogue_entities: NonNegativeInt = 10000
    train_mentions: NonNegativeInt = 1000
    seen_eval_mentions: NonNegativeInt = 2000
    unseen_eval_mentions: NonNegativeInt = 2000
    curve_every: NonNegativeInt = 0


@settings
class BlinkSettings:
    """``hnce finetune-blink`` inputs (docs/input-formats.md); the command's flags set the same
    keys. One catalogue: ``entities`` or ``knowledge_source``.

    Attributes:
        checkpoint: the BLINK bi-encoder's state_dict.
        base_model: a local Hugging Face directory with the BERT config and vocabulary.
        entities: BLINK's entity.jsonl.
        knowledge_source: KILT's kilt_knowledgesource.json.
        encodings: BLINK's all_entities_large.t7 (the initial index without re-encoding).
        aida: the KILT AIDA files.
    """

    checkpoint: Text | None = None
    base_model: Text | None = None
    entities: Text | None = None
    knowledge_source: Text | None = None
    encodings: Text | None = None
    aida: list[Text] = Field(default_factory=list)


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

    def reranker_training(self) -> TrainingSettings:
        """What the reranker trains with: ``training``, but for what ``rerank.training`` sets."""
        return dataclasses.replace(self.training, **dataclasses.asdict(self.rerank.training))

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (YAML/JSON-serialisable); ``config_from_dict`` inverts it."""
        return dataclasses.asdict(self)

    def where(self, key: str) -> str:
        """``file:line`` (or ``--set ...``) a dotted key came from, for error messages."""
        return origin_of(key, getattr(self, "_origins", {}))

    def error(self, key: str, message: str) -> ConfigError:
        """A :class:`ConfigError` about ``key``, naming where it was set."""
        return ConfigError(f"{self.where(key)}: '{key}' {message}")
