"""A dual bi-encoder's towers as sentence-transformers model directories.

Each tower becomes one directory that ``SentenceTransformer(path)`` loads and that gives the
vector hnce's dual scorer reads (x_1 for the mention tower, y_1 for the entity tower):

- the Transformer module at the top: the tower (``save_pretrained``: ``config.json``,
  ``model.safetensors``), its tokenizer (BLINK's markers kept as special tokens) and
  ``sentence_bert_config.json`` with the tower's length (``model.mention_length`` or
  ``model.entity_length``) as ``max_seq_length``;
- for the mention tower, before it, hnce's mention window (:mod:`hnce.encoders.mention_window`,
  copied as ``mention_window.py`` with its config ``mention_window_config.json``): it reads a text
  marking the mention with ``[START_ENT]`` … ``[END_ENT]``, as ``hnce link`` does, and cuts the
  context on both sides of the mention as BLINK and hnce do, where sentence-transformers would cut
  the end of a long input (often the mention itself). sentence-transformers imports the file only
  with ``trust_remote_code=True``;
- ``<i>_Pooling/config.json``: the model's pooling, [CLS] or the mean over the real tokens;
- ``<i>_Normalize/config.json`` when the model normalises its vectors (``model.normalize``), the
  config sentence-transformers 6 writes for its Normalize module;
- ``modules.json`` listing them, and ``config_sentence_transformers.json`` naming the similarity
  the model was trained with: ``dot`` (eq. 9's inner product) or ``cosine`` when normalised.

Module types and the Pooling config use the layout of sentence-transformers 3 to 5 (the layout
of all-MiniLM-L6-v2's directory), which sentence-transformers 6 still reads; the mention window
is a sentence-transformers 6 input module (its ``preprocess``). hnce itself reads a tower back as
a ``model.path`` with ``model.pooling: auto`` (:mod:`hnce.encoders.pooling`).

An entity is fed as BLINK's ``title [unused2] text``: sentence-transformers cuts it at its end,
as BLINK does, so its vector is hnce's for any text.

Only dual models without BLINK's projections export: other scorers read more than one vector per
side, which a sentence embedding cannot carry, and a projection reads BERT's pooler output, which
sentence-transformers' Pooling never does.

Example::

    check_exportable(model.scorer.config.name, None, "scorer.json")
    export_sentence_transformers(model, out_dir)   # out_dir/mention/, out_dir/entity/
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from hnce.encoders import mention_window
from hnce.encoders.biencoder import BiEncoder
from hnce.encoders.formatting import MENTION_END, MENTION_START
from hnce.encoders.mention_window import MODULE_TYPE, MentionWindow
from hnce.encoders.pooling import MODULES_FILE, POOLING_MODULE, Pooling
from hnce.errors import InputError, naming_refused_writes

_MODULE_TYPE = "sentence_transformers.models.{}"
#: sentence-transformers 6's config of its Normalize module (``Normalize().get_config_dict()``)
_NORMALIZE_CONFIG = {
    "module_input_name": "sentence_embedding",
    "module_output_name": "sentence_embedding",
}


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
                tower,
                model.tokenizer,
                length,
                model.pooling,
                model.normalize,
                written[name],
                window=name == "mention",
            )
    return written


def write_tower(
    tower: PreTrainedModel,
    tokenizer: Any,
    max_seq_length: int,
    pooling: Pooling,
    normalize: bool,
    directory: Path,
    *,
    window: bool,
) -> None:
    """One tower as a sentence-transformers directory (see the module docs), with the mention
    window as its first module when ``window``."""
    directory.mkdir(parents=True, exist_ok=True)
    tower.save_pretrained(directory)
    modules = [("", _MODULE_TYPE.format("Transformer"))]
    if window:  # the window saves the tokenizer, which the Transformer module reads too
        write_mention_window(tokenizer, max_seq_length, directory)
        modules.insert(0, ("", MODULE_TYPE))
    else:
        tokenizer.save_pretrained(directory)
    pooling_dir = f"{len(modules)}_{POOLING_MODULE}"
    modules.append((pooling_dir, _MODULE_TYPE.format(POOLING_MODULE)))
    _write_json(directory / pooling_dir / "config.json", pooling_config(tower, pooling))
    if normalize:
        normalize_dir = f"{len(modules)}_Normalize"
        modules.append((normalize_dir, _MODULE_TYPE.format("Normalize")))
        _write_json(directory / normalize_dir / "config.json", _NORMALIZE_CONFIG)
    _write_json(
        directory / MODULES_FILE,
        [
            {"idx": idx, "name": str(idx), "path": path, "type": kind}
            for idx, (path, kind) in enumerate(modules)
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


def write_mention_window(tokenizer: Any, max_seq_length: int, directory: Path) -> None:
    """hnce's mention window in ``directory``: a copy of :mod:`hnce.encoders.mention_window`
    itself, so that sentence-transformers formats a mention with hnce's own code, then what the
    module saves (the tokenizer and its config)."""
    source = Path(mention_window.__file__)
    shutil.copyfile(source, directory / source.name)
    MentionWindow(tokenizer, max_seq_length, MENTION_START, MENTION_END).save(str(directory))


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
