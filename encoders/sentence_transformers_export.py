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

A sum-of-max model (``som``) exports instead as two ``MultiVectorEncoder`` directories of
sentence-transformers 6 (:func:`write_multi_vector_tower`), whose MaxSim is som's score (ColBERT,
Khattab & Zaharia 2020, eq. 3): the same Transformer module (and mention window), then
``<i>_MultiVectorMask`` (the tokens the score reads: every real token, [CLS], [SEP] and the
markers included, as hnce's som does; for the entity tower with ``scorer.skip_punctuation`` less
the punctuation tokens, on every task) and, with ``model.normalize``, a Normalize of the token
embeddings; ``config_sentence_transformers.json`` names ``model_type`` MultiVectorEncoder and
``similarity_fn_name`` maxsim.

Other scorers are refused: multi-m, poly-m, genpoly-m and the general form read their vectors in
ways neither a sentence embedding nor MaxSim over all tokens carries. So are BLINK's projections,
which put a projection of BERT's pooler output (or of the mean) first, and, for som, mean pooling,
whose first token vector is the mean of the others: no sentence-transformers module writes
either into a token sequence.

Example::

    check_exportable(model.scorer.config.name, None, "cls", "scorer.json")
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
#: sentence-transformers 6's own module types, as ``MultiVectorEncoder.save`` writes them
_MULTI_VECTOR_MASK_TYPE = (
    "sentence_transformers.multi_vector_encoder.modules.multi_vector_mask.MultiVectorMask"
)
_NORMALIZE_TYPE = "sentence_transformers.base.modules.normalize.Normalize"
#: the token-level Normalize config (``Normalize(module_input_name="token_embeddings")``)
_TOKEN_NORMALIZE_CONFIG = {
    "module_input_name": "token_embeddings",
    "module_output_name": "token_embeddings",
}
#: the scorers the export carries: dual as sentence embeddings, som as token embeddings
DUAL, SUM_OF_MAX = "dual", "som"


def check_exportable(
    scorer: str, projection_size: int | None, pooling: Pooling, source: str
) -> None:
    """Refuse (:class:`InputError` naming ``source``) a model the export cannot carry: a scorer
    other than dual or som, BLINK's projections (``projection_size``), or som with mean pooling."""
    if scorer not in (DUAL, SUM_OF_MAX):
        raise InputError(
            f"{source}: scorer {scorer!r} reads several vectors per side in a way neither a "
            f"sentence embedding nor MaxSim over all tokens carries; only dual and som models "
            f"export as sentence-transformers"
        )
    if projection_size is not None:
        raise InputError(
            f"{source}: the towers have BLINK's projections (projection_size {projection_size}), "
            f"which put a projection of BERT's pooler output (or the mean) first; no "
            f"sentence-transformers module does"
        )
    if scorer == SUM_OF_MAX and pooling != "cls":
        raise InputError(
            f"{source}: som with {pooling} pooling scores the mean of the token vectors as the "
            f"first one, which no sentence-transformers module writes into a token sequence; "
            f"only som with cls pooling exports"
        )


def export_sentence_transformers(model: BiEncoder, out_dir: Path) -> dict[str, Path]:
    """Write each tower of ``model`` as a sentence-transformers directory ``out_dir/<tower>/``
    (a MultiVectorEncoder's for som); returns the directories by tower name. A write the machine
    refuses (a full disk) is an ``OSError`` naming ``out_dir``."""
    scorer = model.scorer.config.name
    check_exportable(scorer, model.projection_size, model.pooling, "the model")
    towers = {
        "mention": (model.mention_tower, model.mention_length, []),
        "entity": (model.entity_tower, model.entity_length, skipped_tokens(model)),
    }
    written = {}
    with naming_refused_writes(out_dir):
        for name, (tower, length, skipped) in towers.items():
            written[name] = Path(out_dir) / name
            window = name == "mention"
            if scorer == SUM_OF_MAX:
                write_multi_vector_tower(
                    tower, model.tokenizer, length, model.normalize, skipped, written[name], window
                )
            else:
                write_tower(
                    tower,
                    model.tokenizer,
                    length,
                    model.pooling,
                    model.normalize,
                    written[name],
                    window=window,
                )
    return written


def skipped_tokens(model: BiEncoder) -> list[str]:
    """The entity tokens ``model``'s score leaves out (``scorer.skip_punctuation``), as tokens."""
    return model.tokenizer.convert_ids_to_tokens(model.skipped_entity_tokens.tolist())


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
    modules = write_transformer(tower, tokenizer, max_seq_length, directory, window)
    pooling_dir = f"{len(modules)}_{POOLING_MODULE}"
    modules.append((pooling_dir, _MODULE_TYPE.format(POOLING_MODULE)))
    _write_json(directory / pooling_dir / "config.json", pooling_config(tower, pooling))
    if normalize:
        normalize_dir = f"{len(modules)}_Normalize"
        modules.append((normalize_dir, _MODULE_TYPE.format("Normalize")))
        _write_json(directory / normalize_dir / "config.json", _NORMALIZE_CONFIG)
    write_modules(directory, modules)
    _write_json(
        directory / "config_sentence_transformers.json",
        {
            "prompts": {},
            "default_prompt_name": None,
            "similarity_fn_name": "cosine" if normalize else "dot",
        },
    )


def write_multi_vector_tower(
    tower: PreTrainedModel,
    tokenizer: Any,
    max_seq_length: int,
    normalize: bool,
    skipped: list[str],
    directory: Path,
    window: bool,
) -> None:
    """One tower of a som model as a ``MultiVectorEncoder`` directory whose token embeddings are
    hnce's token vectors x_i (or y_j) and whose MaxSim is som's s(x, y) = Σ_i max_j ⟨x_i, y_j⟩
    (ColBERT, Khattab & Zaharia 2020, eq. 3): the Transformer module (after the mention window
    when ``window``), a MultiVectorMask that drops the ``skipped`` tokens on every task, and a
    token-level Normalize when ``normalize``."""
    modules = write_transformer(tower, tokenizer, max_seq_length, directory, window)
    mask_dir = f"{len(modules)}_MultiVectorMask"
    modules.append((mask_dir, _MULTI_VECTOR_MASK_TYPE))
    _write_json(
        directory / mask_dir / "config.json",
        {
            "skiplist_words": skipped,
            "skiplist_tasks": ["query", "document"],
            "keep_only_token_ids": None,
        },
    )
    if normalize:
        normalize_dir = f"{len(modules)}_Normalize"
        modules.append((normalize_dir, _NORMALIZE_TYPE))
        _write_json(directory / normalize_dir / "config.json", _TOKEN_NORMALIZE_CONFIG)
    write_modules(directory, modules)
    _write_json(
        directory / "config_sentence_transformers.json",
        {
            "model_type": "MultiVectorEncoder",
            "prompts": {"query": "", "document": ""},
            "default_prompt_name": None,
            "similarity_fn_name": "maxsim",
        },
    )


def write_transformer(
    tower: PreTrainedModel, tokenizer: Any, max_seq_length: int, directory: Path, window: bool
) -> list[tuple[str, str]]:
    """The tower, its tokenizer and ``sentence_bert_config.json`` in ``directory``, after the
    mention window when ``window``; returns the modules written, (path, type) in order."""
    directory.mkdir(parents=True, exist_ok=True)
    tower.save_pretrained(directory)
    modules = [("", _MODULE_TYPE.format("Transformer"))]
    if window:  # the window saves the tokenizer, which the Transformer module reads too
        write_mention_window(tokenizer, max_seq_length, directory)
        modules.insert(0, ("", MODULE_TYPE))
    else:
        tokenizer.save_pretrained(directory)
    _write_json(
        directory / "sentence_bert_config.json",
        {"max_seq_length": max_seq_length, "do_lower_case": False},
    )
    return modules


def write_modules(directory: Path, modules: list[tuple[str, str]]) -> None:
    """``modules.json``: the modules, (path, type) in order."""
    _write_json(
        directory / MODULES_FILE,
        [
            {"idx": idx, "name": str(idx), "path": path, "type": kind}
            for idx, (path, kind) in enumerate(modules)
        ],
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
