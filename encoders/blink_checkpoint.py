"""Import and export BLINK checkpoints (docs/input-formats.md, BLINK checkpoint).

BLINK's bi-encoder state_dict holds ``context_encoder.bert_model.*`` (mention tower),
``cand_encoder.bert_model.*`` (entity tower) and, when trained with ``add_linear``,
``{context,cand}_encoder.additional_linear.{weight,bias}``. Its cross-encoder holds
``encoder.bert_model.*`` and ``encoder.additional_linear.*`` (the scoring head). BERT parameter
names under ``bert_model.`` are the Hugging Face ``BertModel`` names. Checkpoints from outside are
read with ``torch.load(..., weights_only=True)``; any key mismatch is an error that lists the
missing and unexpected keys. BLINK pools [CLS] (its ``BertEncoder``): an imported model says
``cls`` and only a ``cls`` model exports to BLINK's layout.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor
from transformers import AutoConfig, AutoTokenizer, BertConfig

from hnce.encoders.biencoder import BiEncoder, build_biencoder
from hnce.encoders.local import load_local
from hnce.encoders.reranker import JointReranker, build_reranker
from hnce.encoders.scorers import ScorerConfig
from hnce.errors import InputError

MENTION_PREFIX = "context_encoder."
ENTITY_PREFIX = "cand_encoder."
CROSS_PREFIX = "encoder."
_SHOWN_KEYS = 20


class CheckpointKeyError(InputError):
    """A checkpoint's keys do not match the model: ``missing`` and ``unexpected`` name them."""

    def __init__(self, source: str, missing: list[str], unexpected: list[str]) -> None:
        self.source, self.missing, self.unexpected = source, missing, unexpected

        def listing(keys: list[str]) -> str:
            more = f" ... and {len(keys) - _SHOWN_KEYS} more" if len(keys) > _SHOWN_KEYS else ""
            return ", ".join(keys[:_SHOWN_KEYS]) + more

        super().__init__(
            f"{source}: checkpoint does not match the model: "
            f"{len(missing)} missing keys [{listing(missing)}]; "
            f"{len(unexpected)} unexpected keys [{listing(unexpected)}]"
        )


def read_blink_checkpoint(path: Path) -> dict[str, Tensor]:
    """A BLINK ``.bin`` state_dict, loaded safely; a DataParallel ``module.`` prefix is removed."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such checkpoint file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError) as error:
        raise ValueError(
            f"{path}: cannot read as a state_dict (truncated or not a checkpoint): {error}"
        ) from error
    if not isinstance(state, Mapping):
        raise ValueError(
            f"{path}: expected a state_dict (a mapping of names to tensors), got {type(state)}"
        )
    return {k.removeprefix("module."): v for k, v in state.items()}


def _normalise_bert_key(key: str) -> str | None:
    """Old BERT names (LayerNorm gamma/beta) -> current ones; None for non-persistent buffers."""
    if key.endswith(("embeddings.position_ids", "embeddings.token_type_ids")):
        return None
    if key.endswith("LayerNorm.gamma"):
        return key.replace("LayerNorm.gamma", "LayerNorm.weight")
    if key.endswith("LayerNorm.beta"):
        return key.replace("LayerNorm.beta", "LayerNorm.bias")
    return key


def _prefixed(prefix: str, state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    return {prefix + k: v.detach().cpu() for k, v in state.items()}


def blink_biencoder_state_dict(model: BiEncoder) -> dict[str, Tensor]:
    """The bi-encoder under BLINK's key names (what BLINK's ``BiEncoderModule.state_dict()`` holds)."""
    state: dict[str, Tensor] = {}
    for prefix, tower, projection in (
        (MENTION_PREFIX, model.mention_tower, model.mention_projection),
        (ENTITY_PREFIX, model.entity_tower, model.entity_projection),
    ):
        state |= _prefixed(prefix + "bert_model.", tower.state_dict())
        if projection is not None:
            state |= _prefixed(
                prefix + "additional_linear.", projection.additional_linear.state_dict()
            )
    return state


def blink_crossencoder_state_dict(model: JointReranker) -> dict[str, Tensor]:
    """The reranker under BLINK's cross-encoder key names."""
    state = _prefixed(CROSS_PREFIX + "bert_model.", model.encoder.state_dict())
    return state | _prefixed(CROSS_PREFIX + "additional_linear.", model.head.state_dict())


def _check_keys(
    source: str, expected: Mapping[str, Tensor], state: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """The checkpoint with normalised names, after checking names and shapes against ``expected``."""
    normalised: dict[str, Tensor] = {}
    for key, value in state.items():
        name = _normalise_bert_key(key)
        if name is not None:
            normalised[name] = value
    missing = sorted(set(expected) - set(normalised))
    unexpected = sorted(set(normalised) - set(expected))
    if missing or unexpected:
        raise CheckpointKeyError(source, missing, unexpected)
    mismatched = [
        f"{k} {tuple(normalised[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in sorted(expected)
        if normalised[k].shape != expected[k].shape
    ]
    if mismatched:
        raise ValueError(
            f"{source}: checkpoint shapes do not match the model: {'; '.join(mismatched)}"
        )
    return normalised


def load_blink_biencoder_state_dict(
    model: BiEncoder, state: Mapping[str, Tensor], source: str = "BLINK bi-encoder state_dict"
) -> None:
    """Copy a BLINK bi-encoder state_dict into ``model``; CheckpointKeyError on any key mismatch."""
    state = _check_keys(source, blink_biencoder_state_dict(model), state)

    def part(prefix: str) -> dict[str, Tensor]:
        return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}

    model.mention_tower.load_state_dict(part(MENTION_PREFIX + "bert_model."))
    model.entity_tower.load_state_dict(part(ENTITY_PREFIX + "bert_model."))
    for prefix, projection in (
        (MENTION_PREFIX, model.mention_projection),
        (ENTITY_PREFIX, model.entity_projection),
    ):
        if projection is not None:
            projection.additional_linear.load_state_dict(part(prefix + "additional_linear."))


def _base_config_and_tokenizer(
    base_model: Path | str | BertConfig, tokenizer: object | None
) -> tuple[BertConfig, object]:
    """BLINK checkpoints carry no config: take it (and the vocabulary) from the base model directory."""
    if isinstance(base_model, BertConfig):
        if tokenizer is None:
            raise ValueError("importing a BLINK checkpoint onto a BertConfig needs a tokenizer")
        return base_model, tokenizer
    path = Path(base_model)
    config = load_local(AutoConfig, path)
    return config, tokenizer if tokenizer is not None else load_local(AutoTokenizer, path)


def _checkpoint_state(
    checkpoint: Path | Mapping[str, Tensor], unnamed: str
) -> tuple[str, dict[str, Tensor]]:
    """(name for error messages, state_dict) of a checkpoint file or an in-memory state_dict
    (named ``unnamed``)."""
    if isinstance(checkpoint, Path | str):
        return str(checkpoint), read_blink_checkpoint(Path(checkpoint))
    return unnamed, dict(checkpoint)


def import_blink_biencoder(
    checkpoint: Path | Mapping[str, Tensor],
    base_model: Path | str | BertConfig,
    tokenizer: object | None = None,
    scorer: ScorerConfig | str = "dual",
    mention_length: int = 32,
    entity_length: int = 128,
) -> BiEncoder:
    """A BiEncoder holding a BLINK bi-encoder (e.g. ``biencoder_wiki_large.bin`` on bert-large-uncased).

    ``base_model`` gives the BERT config and vocabulary (a local directory, or a ``BertConfig`` with
    ``tokenizer``); its weights and declared pooling are not read: BLINK pools [CLS].
    ``additional_linear`` is detected from the checkpoint.
    """
    source, state = _checkpoint_state(checkpoint, "BLINK bi-encoder state_dict")
    config, tokenizer = _base_config_and_tokenizer(base_model, tokenizer)
    linear = state.get(MENTION_PREFIX + "additional_linear.weight")
    model = build_biencoder(
        config,
        scorer,
        tokenizer=tokenizer,
        mention_length=mention_length,
        entity_length=entity_length,
        projection_size=None if linear is None else int(linear.shape[0]),
        pooling="cls",
    )
    load_blink_biencoder_state_dict(model, state, source)
    return model.eval()


def export_blink_biencoder(model: BiEncoder, path: Path) -> None:
    """Save ``model`` as a BLINK bi-encoder state_dict file (loadable by BLINK's ``load_model``).

    BLINK pools [CLS] and scores unnormalised inner products, so a mean-pooled or normalised
    model is refused: BLINK would score it differently."""
    if model.pooling != "cls":
        raise ValueError(
            f"{path}: BLINK pools [CLS]; this model pools {model.pooling}, so BLINK would "
            f"not score it as hnce trained it"
        )
    if model.normalize:
        raise ValueError(
            f"{path}: BLINK scores unnormalised inner products; this model normalises its "
            f"vectors (model.normalize), so BLINK would not score it as hnce trained it"
        )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(blink_biencoder_state_dict(model), path)


def load_blink_crossencoder_state_dict(
    model: JointReranker,
    state: Mapping[str, Tensor],
    source: str = "BLINK cross-encoder state_dict",
) -> None:
    """Copy a BLINK cross-encoder state_dict into ``model``; CheckpointKeyError on any key mismatch."""
    state = _check_keys(source, blink_crossencoder_state_dict(model), state)
    bert_prefix, head_prefix = CROSS_PREFIX + "bert_model.", CROSS_PREFIX + "additional_linear."
    model.encoder.load_state_dict(
        {k[len(bert_prefix) :]: v for k, v in state.items() if k.startswith(bert_prefix)}
    )
    model.head.load_state_dict(
        {k[len(head_prefix) :]: v for k, v in state.items() if k.startswith(head_prefix)}
    )


def import_blink_crossencoder(
    checkpoint: Path | Mapping[str, Tensor],
    base_model: Path | str | BertConfig,
    tokenizer: object | None = None,
    mention_length: int = 32,
    entity_length: int = 128,
    max_length: int | None = None,
) -> JointReranker:
    """A JointReranker holding a BLINK cross-encoder (``encoder.bert_model.*`` + ``encoder.additional_linear.*``)."""
    source, state = _checkpoint_state(checkpoint, "BLINK cross-encoder state_dict")
    config, tokenizer = _base_config_and_tokenizer(base_model, tokenizer)
    model = build_reranker(config, tokenizer, mention_length, entity_length, max_length)
    load_blink_crossencoder_state_dict(model, state, source)
    return model.eval()


def export_blink_crossencoder(model: JointReranker, path: Path) -> None:
    """Save ``model`` as a BLINK cross-encoder state_dict file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(blink_crossencoder_state_dict(model), path)
