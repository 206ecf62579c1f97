"""The cross-field rules of a recipe, which no single field's type can express (a scorer mined
exactly needs a flat index, a sampler's needs of the rest of the recipe, ...); each failure is a
:class:`ConfigError` naming the key and where it was set.
"""

from __future__ import annotations

import dataclasses

from hnce.cluster.compute.refresh.settings import refresh_problem
from hnce.cluster.stores.index_spec import default_candidate_depth, default_nprobe
from hnce.mining.losses import takes_temperature
from hnce.mining.samplers import SAMPLER_SPECS
from hnce.mining.schedule import SCHEDULED_FIELDS
from hnce.pipeline.config.sections import Config


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
    if config.index.kind == "plaid" and config.model.scorer.name not in ("som", "multi"):
        raise config.error(
            "index.kind",
            f"is 'plaid', the token index of late interaction, but scorer "
            f"{config.model.scorer.name!r} keeps one vector an entity; use plaid with scorer som "
            f"or multi, or index.kind ivfpq (compressed) or flat (exact)",
        )
    if config.index.token_pool_factor > 1 and config.model.scorer.name != "som":
        raise config.error(
            "index.token_pool_factor",
            f"is {config.index.token_pool_factor}, but token pooling leaves an entity fewer "
            f"token vectors, which only sum-of-max scores (scorer {config.model.scorer.name!r} "
            f"reads a fixed number); set index.token_pool_factor: 1",
        )
    if config.index.token_copy and (
        config.model.scorer.name != "som" or not config.index.quantised
    ):
        raise config.error(
            "index.token_copy",
            f"is true, but it chooses what a compressed sum-of-max shard rescores from (index.kind "
            f"ivfpq or plaid, scorer som), and this recipe has scorer {config.model.scorer.name!r} over "
            f"{config.index.kind!r} (flat shards rescore from their own vectors; compressed "
            f"multi-m always keeps its copy); set index.token_copy: false",
        )
    if config.index.nprobe is None:
        config.index.nprobe = default_nprobe(
            config.index.nlist, config.model.scorer.name == "multi"
        )
    if config.index.candidate_depth is None:
        config.index.candidate_depth = default_candidate_depth(config.index.kind)
    if negatives.share == "global" and not config.model.scorer.indexable:
        raise config.error(
            "negatives.share",
            f"is 'global', which gathers the entity side of the score across workers, but "
            f"'model.scorer.name' is {config.model.scorer.name!r}, whose score is not split into "
            f"a mention side and an entity side (not indexable, docs/math.md); use share 'batch' "
            f"or 'none', or a dual, multi or som scorer",
        )
    _validate_samplers(config)
    on_index = negatives.source == "index"
    trigger_set = _set(config, "refresh.trigger")
    problem = refresh_problem(
        refresh, on_index, config.data.train_split, negatives.num_negatives, trigger_set
    )
    if problem is not None:
        raise config.error(*problem)
    if config.loss.temperature is not None and not takes_temperature(config.loss.name):
        raise config.error(
            "loss.temperature",
            f"is set, but loss {config.loss.name!r} divides its scores by no temperature (nce, "
            f"sampled-softmax and focal do); remove it or pick such a loss",
        )
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


def _set(config: Config, key: str) -> bool:
    """Whether the recipe or an override set ``key`` (not left to its default)."""
    return key in getattr(config, "_origins", {})


def _validate_samplers(config: Config) -> None:
    """What the chosen sampler's spec asks of the rest of the recipe (the negative cache, unset,
    first resolved to whether it applies)."""
    negatives = config.negatives
    spec = SAMPLER_SPECS[negatives.sampler]
    if negatives.cache.enabled is None:
        negatives.cache.enabled = cache_applies(config)
    name = negatives.sampler
    if spec.candidates == "index" and negatives.source != "index":
        raise config.error(
            "negatives.sampler",
            f"{name!r} mines from an index but 'negatives.source' is {negatives.source!r}",
        )
    mined = config.refresh.enabled or negatives.initial != "random" or negatives.cache.enabled
    if spec.candidates == "index" and not mined:
        raise config.error(
            "negatives.sampler",
            f"{name!r} needs mined negatives but 'refresh.enabled' is false, "
            f"'negatives.initial' is random and 'negatives.cache.enabled' is false",
        )
    _validate_cache(config)
    if spec.candidates == "lexical" and negatives.source != "none":
        raise config.error(
            "negatives.sampler",
            f"is {name}, which needs no index, but 'negatives.source' is {negatives.source!r}: "
            f"set it to none, or start an index run from BM25 with 'negatives.initial: lexical'",
        )
    if negatives.initial != "random" and negatives.source != "index":
        raise config.error(
            "negatives.initial",
            f"is {negatives.initial} (the initial negatives) but 'negatives.source' is none",
        )
    # only the chosen sampler's own rule: another sampler's options are not read by this recipe
    if spec.check is not None and (problem := spec.check(negatives)) is not None:
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


def cache_refusal(config: Config) -> tuple[str, str] | None:
    """Why the negative cache cannot serve the recipe (the key and the reason), or None: it needs
    a sampler of index candidates, a scorer with a fixed number of vectors an entity, and weights
    readable outside the engine (ZeRO below 3)."""
    name = config.negatives.sampler
    if SAMPLER_SPECS[name].candidates != "index":
        return (
            "negatives.cache.enabled",
            f"is true, but sampler {name!r} draws no index candidates for the cache to replace; "
            f"use hard, mixed or another sampler of an index",
        )
    if config.model.scorer.name == "som":
        return (
            "negatives.cache.enabled",
            "is true, but sum-of-max keeps a vector per entity token, which a cache of fixed "
            "rows cannot hold (docs/negatives.md, 'Negative cache'); use dual or multi-m",
        )
    if config.training.zero_stage == 3:
        return (
            "training.zero_stage",
            "is 3, whose partitioned weights cannot encode the cache's mentions outside the "
            "engine's forward; use 0, 1 or 2",
        )
    return None


def cache_applies(config: Config) -> bool:
    """Whether the negative cache can serve the recipe (no :func:`cache_refusal`, candidates
    mined from an index): where it is on when the recipe leaves it unset."""
    return config.negatives.source == "index" and cache_refusal(config) is None


def _validate_cache(config: Config) -> None:
    """``negatives.cache`` replaces index candidates (:func:`cache_refusal`); the whole catalogue
    needs it and no cross-worker sharing. Unset, it is on exactly where it can be
    (:func:`cache_applies`)."""
    negatives = config.negatives
    if not negatives.cache.enabled:
        if negatives.cache.whole_catalogue:
            raise config.error(
                "negatives.cache.whole_catalogue",
                "is true, but 'negatives.cache.enabled' is false: the catalogue's columns are "
                "the cache's rows",
            )
        return
    if negatives.cache.whole_catalogue and negatives.share == "global":
        raise config.error(
            "negatives.cache.whole_catalogue",
            "is true with 'negatives.share: global': another worker's candidates would enter "
            "the softmax twice (as gathered columns and as cache rows); use share batch",
        )
    refusal = cache_refusal(config)
    if refusal is not None:
        raise config.error(*refusal)


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
    """Each scheduled option must set a field of the chosen sampler."""
    name = config.negatives.sampler
    sampler = SAMPLER_SPECS[name].sampler
    fields = (
        {f.name for f in dataclasses.fields(sampler)}
        if dataclasses.is_dataclass(sampler)
        else set()
    )
    for key in config.negatives.schedule.scheduled:
        if SCHEDULED_FIELDS[key] not in fields:
            raise config.error(
                f"negatives.schedule.{key}",
                f"is scheduled, but sampler {name!r} has no option {SCHEDULED_FIELDS[key]!r} "
                f"to schedule",
            )
