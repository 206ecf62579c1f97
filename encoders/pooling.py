"""Pooling: which vector a tower puts first, x_1 / y_1, the vector single-vector scorers read.

The score functions (eq. 9, docs/math.md) read x_1 and y_1 as a side's single vector: dual scores
⟨x_1, y_1⟩, multi-m's query is x_1, poly-m's entity query is y_1. Pooling decides what that first
vector is; every other position keeps its token state:

- ``cls``: the [CLS] token state, as BLINK (and the paper's towers) use it;
- ``mean``: the mean of the real token states, padding excluded (sentence-transformers' mean
  pooling: all-MiniLM-L6-v2 was trained with it).

So with ``mean`` dual scores the two mean vectors, multi-m's max runs over the mean and the token
states y_2..y_m, som's first query/key is the mean instead of [CLS], and poly-m's codes attend over
the mean and the token states.

``auto`` takes what a model directory declares: a sentence-transformers directory names its
Pooling module in ``modules.json`` and that module's mode in ``<module>/config.json``
(``pooling_mode_mean_tokens: true`` up to sentence-transformers 5, ``pooling_mode: mean`` from 6,
whose module types also moved, e.g. ``sentence_transformers.models.Pooling`` to
``sentence_transformers.sentence_transformer.modules.pooling.Pooling``); a directory
without ``modules.json`` (a plain Hugging Face or BLINK model) pools [CLS]. hnce's own mention
window, the first module of an exported mention tower (:mod:`hnce.encoders.mention_window`),
formats a mention as hnce does, so it leaves the vector as hnce makes it. A Normalize module is
read but not applied: hnce scores unnormalised inner products (eq. 9) and normalising x_1 alone
would put it on another scale than the token vectors that multi-m, som and poly-m compare it with
(``model.normalize`` normalises every vector instead: ``BiEncoder.encode_with``).

Example::

    pooling = resolve_pooling("auto", minilm_path())  # "mean"
    hidden = pooled_first(hidden, attention_mask, pooling)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import TypeAdapter
from torch import Tensor

from hnce.documents import read_document
from hnce.encoders.mention_window import MODULE_TYPE as MENTION_WINDOW_TYPE
from hnce.errors import InputError

Pooling = Literal["cls", "mean"]
POOLINGS: tuple[Pooling, ...] = ("cls", "mean")
MODULES_FILE = "modules.json"
POOLING_MODULE = "Pooling"
# Module classes that leave the pooled vector as the Transformer and Pooling modules made it
# (Normalize only rescales it; see the module docstring for why it is not applied).
_PASSIVE_MODULES = frozenset({"Transformer", "Normalize"})
# sentence-transformers' Pooling modes that hnce implements: flags (up to v5), names (v6).
_FLAGS: dict[str, Pooling] = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean"}
_NAMES: dict[str, Pooling] = {"cls": "cls", "mean": "mean"}


#: sentence-transformers' ``modules.json`` and Pooling config: a list of objects and an object;
#: of their keys hnce reads only those it needs (a module's type and path, the pooling mode)
_MODULES = TypeAdapter(list[dict[str, Any]])
_POOLING_CONFIG = TypeAdapter(dict[str, Any])


def _module_class(module: dict) -> str:
    """The class name of a ``modules.json`` entry's ``type``; '' when not sentence-transformers'."""
    kind = str(module.get("type"))
    return kind.rsplit(".", 1)[-1] if kind.startswith("sentence_transformers.") else ""


def _declared_mode(config_path: Path, pooling_config: dict) -> Pooling:
    """The one mode a Pooling config turns on (v6 ``pooling_mode`` name or v5 flags)."""
    if isinstance(pooling_config.get("pooling_mode"), str):
        name = pooling_config["pooling_mode"]
        if name not in _NAMES:
            raise InputError(
                f"{config_path}: pooling_mode {name!r}; hnce implements {sorted(_NAMES)}"
            )
        return _NAMES[name]
    chosen = sorted(k for k, v in pooling_config.items() if k.startswith("pooling_mode") and v)
    if len(chosen) != 1 or chosen[0] not in _FLAGS:
        raise InputError(
            f"{config_path}: pooling modes {chosen} are on; hnce implements exactly one of "
            f"{sorted(_FLAGS)}"
        )
    return _FLAGS[chosen[0]]


def declared_pooling(model_dir: Path) -> Pooling:
    """The pooling ``model_dir`` declares: its sentence-transformers Pooling module's mode, or
    ``cls`` when it has no ``modules.json``. A mode hnce does not implement (max, weighted mean,
    last token, several at once), a module that would change the pooled vector (e.g. Dense) or a
    malformed file is an :class:`InputError` naming the file."""
    modules_path = Path(model_dir) / MODULES_FILE
    if not modules_path.is_file():
        return "cls"
    modules = read_document(modules_path, _MODULES, "sentence-transformers modules list")
    changing = [
        str(m.get("type"))
        for m in modules
        if _module_class(m) != POOLING_MODULE
        and _module_class(m) not in _PASSIVE_MODULES
        and m.get("type") != MENTION_WINDOW_TYPE
    ]
    if changing:
        raise InputError(
            f"{modules_path}: modules {changing} change the pooled vector and hnce cannot apply "
            f"them; set model.pooling to cls or mean explicitly to use the transformer alone"
        )
    pooling_modules = [m for m in modules if _module_class(m) == POOLING_MODULE]
    if len(pooling_modules) != 1:
        raise InputError(
            f"{modules_path}: declares {len(pooling_modules)} Pooling modules, expected 1"
        )
    config_path = Path(model_dir) / str(pooling_modules[0].get("path", "")) / "config.json"
    if not config_path.is_file():
        raise InputError(f"{config_path}: missing; {modules_path} names it as the Pooling module")
    pooling_config = read_document(config_path, _POOLING_CONFIG, "Pooling module config")
    return _declared_mode(config_path, pooling_config)


def resolve_pooling(requested: str, model_dir: Path | None) -> Pooling:
    """``requested`` (auto | cls | mean) made concrete: ``auto`` reads ``model_dir``'s
    declaration (:func:`declared_pooling`); a model with no directory (a ``BertConfig``) pools
    [CLS]."""
    if requested == "auto":
        return "cls" if model_dir is None else declared_pooling(model_dir)
    if requested not in POOLINGS:
        raise ValueError(f"pooling {requested!r}: expected auto or one of {list(POOLINGS)}")
    return requested  # type: ignore[return-value]


def mean_pool(hidden: Tensor, mask: Tensor) -> Tensor:
    """Mean of the real token states: Σ_i m_i h_i / Σ_i m_i, [N, L, d] with mask [N, L] -> [N, d]."""
    weights = mask.to(hidden.dtype)[..., None]
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)


def pooled_first(hidden: Tensor, mask: Tensor, pooling: Pooling) -> Tensor:
    """``hidden`` [N, L, d] with position 0 holding the pooled vector: unchanged for ``cls``, the
    masked mean for ``mean``."""
    if pooling == "cls":
        return hidden
    return torch.cat([mean_pool(hidden, mask)[:, None], hidden[:, 1:]], dim=1)
