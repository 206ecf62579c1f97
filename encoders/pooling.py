"""Pooling: which vector a tower puts first, x_1 / y_1, the vector single-vector scorers read.

The score functions (eq. 9, DESIGN.md §3) read x_1 and y_1 as a side's single vector: dual scores
⟨x_1, y_1⟩, multi-m's query is x_1, poly-m's entity query is y_1. Pooling decides what that first
vector is; every other position keeps its token state:

- ``cls``: the [CLS] token state, as BLINK (and the paper's towers) use it;
- ``mean``: the mean of the real token states, padding excluded (sentence-transformers' mean
  pooling: all-MiniLM-L6-v2 was trained with it).

So with ``mean`` dual scores the two mean vectors, multi-m's max runs over the mean and the token
states y_2..y_m, som's first query/key is the mean instead of [CLS], and poly-m's codes attend over
the mean and the token states.

``auto`` takes what a model directory declares: a sentence-transformers directory names its
Pooling module in ``modules.json`` and that module's mode in ``<module>/config.json``; a directory
without ``modules.json`` (a plain Hugging Face or BLINK model) pools [CLS]. A Normalize module is
read but not applied: hnce scores unnormalised inner products (eq. 9) and normalising x_1 alone
would put it on another scale than the token vectors that multi-m, som and poly-m compare it with.

Example::

    pooling = resolve_pooling("auto", minilm_path())  # "mean"
    hidden = pooled_first(hidden, attention_mask, pooling)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor

from encoders.errors import InputError

Pooling = Literal["cls", "mean"]
POOLINGS: tuple[Pooling, ...] = ("cls", "mean")
MODULES_FILE = "modules.json"
POOLING_MODULE = "sentence_transformers.models.Pooling"
# Modules that leave the pooled vector as the Transformer and Pooling modules made it (Normalize
# only rescales it; see the module docstring for why it is not applied).
_PASSIVE_MODULES = frozenset(
    {"sentence_transformers.models.Transformer", "sentence_transformers.models.Normalize"}
)
# sentence-transformers' Pooling config keys for the modes hnce implements.
_MODES: dict[str, Pooling] = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean"}


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise InputError(f"{path}:{error.lineno}: not valid JSON: {error.msg}") from error


def declared_pooling(model_dir: Path) -> Pooling:
    """The pooling ``model_dir`` declares: its sentence-transformers Pooling module's mode, or
    ``cls`` when it has no ``modules.json``. A mode hnce does not implement (max, weighted mean,
    last token, several at once), a module that would change the pooled vector (e.g. Dense) or a
    malformed file is an :class:`InputError` naming the file."""
    modules_path = Path(model_dir) / MODULES_FILE
    if not modules_path.is_file():
        return "cls"
    modules = _read_json(modules_path)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise InputError(f"{modules_path}: expected a list of modules (objects with a 'type')")
    types = [str(module.get("type")) for module in modules]
    changing = [t for t in types if t != POOLING_MODULE and t not in _PASSIVE_MODULES]
    if changing:
        raise InputError(
            f"{modules_path}: modules {changing} change the pooled vector and hnce cannot apply "
            f"them; set model.pooling to cls or mean explicitly to use the transformer alone"
        )
    pooling_modules = [m for m in modules if m.get("type") == POOLING_MODULE]
    if len(pooling_modules) != 1:
        raise InputError(
            f"{modules_path}: declares {len(pooling_modules)} {POOLING_MODULE} modules, expected 1"
        )
    config_path = Path(model_dir) / str(pooling_modules[0].get("path", "")) / "config.json"
    if not config_path.is_file():
        raise InputError(f"{config_path}: missing; {modules_path} names it as the Pooling module")
    pooling_config = _read_json(config_path)
    if not isinstance(pooling_config, dict):
        raise InputError(f"{config_path}: expected an object of pooling_mode_* flags")
    chosen = sorted(k for k, v in pooling_config.items() if k.startswith("pooling_mode") and v)
    if len(chosen) != 1 or chosen[0] not in _MODES:
        raise InputError(
            f"{config_path}: pooling modes {chosen} are on; hnce implements exactly one of "
            f"{sorted(_MODES)}"
        )
    return _MODES[chosen[0]]


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
