"""A dual bi-encoder's towers as sentence-transformers model directories.

Each tower becomes one directory that ``SentenceTransformer(path)`` loads and that gives the
vector hnce's dual scorer reads (x_1 for the mention tower, y_1 for the entity tower):

- the Transformer module at the top: the tower (``save_pretrained``: ``config.json``,
  ``model.safetensors``), its tokenizer (BLINK's markers kept as special tokens) and
  ``sentence_bert_config.json`` with the tower's length (``model.mention_length`` or
  ``model.entity_length``) as ``max_seq_length``;
- ``1_Pooling/config.json``: the model's pooling, [CLS] or the mean over the real tokens;
- a Normalize module when the model normalises its vectors (``model.normalize``);
- ``modules.json`` listing them, and ``config_sentence_transformers.json`` naming the similarity
  the model was trained with: ``dot`` (eq. 9's inner product) or ``cosine`` when normalised.

Module types and the Pooling config use the layout of sentence-transformers 3 to 5 (the layout
of all-MiniLM-L6-v2's directory), which sentence-transformers 6 still reads; hnce itself reads it
back as a ``model.path`` with ``model.pooling: auto`` (:mod:`hnce.encoders.pooling`).

The towers embed text as hnce does when it is given in BLINK's layout
(:mod:`hnce.encoders.formatting`): a mention as ``left [unused0] mention [unused1] right``, an
entity as ``title [unused2] text``. sentence-transformers cuts a long input at its end, so an
entity's vector is the same for any text, and a mention's when its context fits the length
(BLINK keeps context on both sides of a long mention instead).

Only dual models without BLINK's projections export: other scorers read more than one vector per
side, which a sentence embedding cannot carry, and a projection reads BERT's pooler output, which
sentence-transformers' Pooling never does.

Example::

    check_exportable(model.scorer.config.name, None, "scorer.json")
    export_sentence_transformers(model, out_dir)   # out_dir/mention/, out_dir/entity/
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from hnce.encoders.biencoder import BiEncoder
from hnce.encoders.pooling import MODULES_FILE, POOLING_MODULE, Pooling
from hnce.errors import InputError, naming_refused_writes

POOLING_DIR = f"1_{POOLING_MODULE}"
NORMALIZE_DIR = "2_Normalize"
_MODULE_TYPE = "sentence_transformers.models.{}"


def check_exportable(scorer: str, projection_size: int | None, source: str) -> None:
    """Refuse (:class:`InputError` naming ``source``) a model the export cannot carry: a scorer
    other than dual, or BLINK's projections (``projection_size``)."""
    if scorer != "dual":
        raise InputError(
            f"{source}: scorer {scorer!r} reads several vectors per side; only a dual model "
            f"exports as sentence-transformers (one vector per text)"
        )
    if projection_size is not None:
        raise InputError(
            f"{source}: the towers have BLINK's projections (projection_size {projection_size}), "
            f"which read BERT's pooler output; sentence-transformers' Pooling cannot"
        )


def export_sentence_transformers(model: BiEncoder, out_dir: Path) -> dict[str, Path]:
    """Write each tower of ``model`` as a sentence-transformers directory ``out_dir/<tower>/``;
    returns the directories by tower name. A write the machine refuses (a full disk) is an
    ``OSError`` naming ``out_dir``."""
    projection = model.entity_projection
    check_exportable(
        model.scorer.config.name,
        None if projection is None else projection.additional_linear.out_features,
        "the model",
    )
    towers = {
        "mention": (model.mention_tower, model.mention_length),
        "entity": (model.entity_tower, model.entity_length),
    }
    written = {}
    with naming_refused_writes(out_dir):
        for name, (tower, length) in towers.items():
            written[name] = Path(out_dir) / name
            write_tower(
                tower, model.tokenizer, length, model.pooling, model.normalize, written[name]
            )
    return written


def write_tower(
    tower: PreTrainedModel,
    tokenizer: Any,
    max_seq_length: int,
    pooling: Pooling,
    normalize: bool,
    directory: Path,
) -> None:
    """One tower as a sentence-transformers directory (see the module docs)."""
    directory.mkdir(parents=True, exist_ok=True)
    tower.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    modules = [("0", "", "Transformer"), ("1", POOLING_DIR, POOLING_MODULE)]
    if normalize:
        modules.append(("2", NORMALIZE_DIR, "Normalize"))
    _write_json(
        directory / MODULES_FILE,
        [
            {"idx": int(name), "name": name, "path": path, "type": _MODULE_TYPE.format(kind)}
            for name, path, kind in modules
        ],
    )
    _write_json(
        directory / "sentence_bert_config.json",
        {"max_seq_length": max_seq_length, "do_lower_case": False},
    )
    _write_json(
        directory / "config_sentence_transformers.json",
        {
            "prompts": {},
            "default_prompt_name": None,
            "similarity_fn_name": "cosine" if normalize else "dot",
        },
    )
    _write_json(directory / POOLING_DIR / "config.json", pooling_config(tower, pooling))


def pooling_config(tower: PreTrainedModel, pooling: Pooling) -> dict[str, Any]:
    """sentence-transformers' Pooling config (flags, one on) for ``pooling`` over ``tower``'s states."""
    return {
        "word_embedding_dimension": int(tower.config.hidden_size),
        "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": False,
        "include_prompt": True,
    }


def _write_json(path: Path, payload: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
