"""hnce's one settings tree: every command of a run reads the same recipe (ColBERT-style sections).

A recipe is a YAML file whose top-level sections are the fields of :class:`Config`; ``--set
section.key=value`` overrides are applied on top, and :func:`load_config` validates the whole
tree before any work starts. Sections are declared where they are consumed and composed in
:mod:`.sections` ("here" below):

=========  ==============================================  ===============================
section    what                                            declared in
=========  ==============================================  ===============================
run        run directory, seed                             here
data       dataset directory and splits                    here
model      towers, lengths, pooling, ``scorer``            here; ``scorer`` in hnce.encoders.scorers
negatives  sampler, K, sharing, per-sampler options         here
loss       contrastive loss and its temperature            here (built by hnce.mining.losses)
training   DeepSpeed optimisation under Ray Train          here
refresh    the refresh, one group per trigger              hnce.cluster.compute.refresh.settings
index      FAISS shards, device, retention                 hnce.cluster.stores.index_spec
cluster    where Ray runs                                  hnce.cluster.compute.session
eval       recall@k                                        here
rerank     the joint reranker, how its training differs    here
demo       the WordNet demo subset                         here
blink      ``finetune-blink`` inputs                       here
=========  ==============================================  ===============================

Every error is a :class:`ConfigError` naming the dotted key and, for keys from a file, the file
and line: unknown keys, wrong types, values out of range, duplicate keys (both lines), and the
cross-field rules of :func:`.validation.validate` (e.g. a scorer mined exactly, ``ScorerConfig.mining``, with
an approximate ``index.kind``).

Example::

    config = load_config(Path("configs/demo.yaml"), ["training.steps=200", "negatives.sampler=hard"])
Modules: :mod:`.sections` (the settings tree), :mod:`.origins` (where a key was set, and the
error naming it), :mod:`.loader` (YAML recipes, ``--set`` overrides, building a :class:`Config`),
:mod:`.validation` (the cross-field rules), :mod:`.reference` (docs/settings.md, every key with
its default and description, generated from the tree).
"""

from __future__ import annotations

from hnce.pipeline.config.loader import config_from_dict, dump_config, load_config, read_recipe
from hnce.pipeline.config.origins import ConfigError
from hnce.pipeline.config.sections import (
    BlinkSettings,
    Config,
    CoresMode,
    DeepSpeedStateKept,
    NegativesSettings,
    TrainingSettings,
)

__all__ = [
    "BlinkSettings",
    "Config",
    "ConfigError",
    "CoresMode",
    "DeepSpeedStateKept",
    "NegativesSettings",
    "TrainingSettings",
    "config_from_dict",
    "dump_config",
    "load_config",
    "read_recipe",
]
