"""hnce: distributed training of dense entity retrievers on refreshed hard and mixed negatives.

The distribution installs one top-level package, ``hnce``, whose subpackages are the
repository's four layers (mapped by ``pyproject.toml``; imports flow one way, checked by the
suite's layering contract):

=================  ==========================================================================
``hnce.pipeline``  recipes, converters, the DeepSpeed trainer under Ray Train, evaluation, CLI
``hnce.cluster``   on-disk stores (``hnce.cluster.stores``) and Ray compute (encoder pool,
                   shard holders, refresh)
``hnce.mining``    negative samplers and contrastive losses
``hnce.encoders``  BERT towers, score functions, the joint reranker, checkpoints
=================  ==========================================================================

The names below are the public API; they are imported on first use, so ``import hnce.encoders``
does not pull in Ray or DeepSpeed.

Example::

    import hnce

    config = hnce.load_config("configs/demo.yaml", ["training.steps=200"])
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_PUBLIC = {
    "Config": "hnce.pipeline.config",
    "ConfigError": "hnce.pipeline.config",
    "EntityLinker": "hnce.pipeline.link",
    "InputError": "hnce.errors",
    "load_config": "hnce.pipeline.config",
}

__all__ = ["__version__", *sorted(_PUBLIC)]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'hnce' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return __all__
