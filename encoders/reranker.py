"""Joint reranker: a cross-encoder over mention and entity together, in BLINK's cross-encoder layout.

s(x, y) = wᵀ BERT([x ; y])  (docs/math.md, eq. (18)). The input is BLINK's: the mention block
``[CLS] left [unused0] mention [unused1] right [SEP]`` padded to the mention length, followed by the
entity ``title [unused2] text [SEP]`` (the entity's own [CLS] dropped), cut to ``max_length``.
Token type 1 marks the real entity tokens, padding is masked out, and BLINK's padding inside the
mention block is kept so position ids match BLINK checkpoints. As BLINK's cross-encoder
(``add_linear``), the head reads the pooler output through dropout and a linear layer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from pydantic import TypeAdapter
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from transformers import AutoModel, AutoTokenizer, BertConfig, BertModel, PreTrainedModel

from hnce.documents import DocumentMissing, document_record, read_document
from hnce.encoders.formatting import register_markers, tokenize_entities, tokenize_mentions
from hnce.encoders.local import load_local
from hnce.encoders.towers import checkpointed_chunks, enable_activation_checkpointing, use_sdpa
from hnce.errors import naming_refused_writes

RERANKER_FILE = "reranker.json"
HEAD_WEIGHTS_FILE = "head.safetensors"


@document_record
class RerankerDescription:
    """``reranker.json``: the lengths a reranker export was trained at (read against this
    schema: an edited or cut-short description is named, not crashed on)."""

    mention_length: int
    entity_length: int
    max_length: int | None


_DESCRIPTION = TypeAdapter(RerankerDescription)


def cross_encoder_inputs(
    mention_batch: Mapping[str, Tensor],
    candidate_batch: Mapping[str, Tensor],
    mention_length: int,
    max_length: int | None = None,
    pad_id: int = 0,
) -> dict[str, Tensor]:
    """Pair each mention [B, Lm] with its candidates [B, K, Le] -> ``input_ids``, ``attention_mask``,
    ``token_type_ids`` [B, K, L] in BLINK's layout (mention block padded to ``mention_length``)."""
    mention_ids, mention_mask = mention_batch["input_ids"], mention_batch["attention_mask"]
    if mention_ids.shape[1] > mention_length:
        raise ValueError(
            f"mention width {mention_ids.shape[1]} exceeds mention_length {mention_length}"
        )
    extra = mention_length - mention_ids.shape[1]
    mention_ids = nn.functional.pad(mention_ids, (0, extra), value=pad_id)
    mention_mask = nn.functional.pad(mention_mask, (0, extra), value=0)
    entity_ids, entity_mask = candidate_batch["input_ids"], candidate_batch["attention_mask"]
    batch, candidates = entity_ids.shape[:2]
    input_ids = torch.cat(
        [mention_ids[:, None].expand(batch, candidates, -1), entity_ids[..., 1:]], dim=-1
    )
    attention_mask = torch.cat(
        [mention_mask[:, None].expand(batch, candidates, -1), entity_mask[..., 1:]], dim=-1
    )
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[..., mention_length:] = attention_mask[..., mention_length:]
    if max_length is not None:
        input_ids, attention_mask, token_type_ids = (
            t[..., :max_length] for t in (input_ids, attention_mask, token_type_ids)
        )
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "token_type_ids": token_type_ids,
    }


class JointReranker(nn.Module):
    """Cross-encoder reranker (joint): one BERT over the pair, a linear head on the pooled [CLS]."""

    def __init__(
        self,
        encoder: PreTrainedModel,
        tokenizer: object,
        mention_length: int = 32,
        entity_length: int = 128,
        max_length: int | None = None,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.tokenizer = tokenizer
        self.mention_length = mention_length
        self.entity_length = entity_length
        self.max_length = (
            max_length if max_length is not None else mention_length + entity_length - 1
        )
        self.dropout = nn.Dropout(0.1)
        self.head = nn.Linear(int(encoder.config.hidden_size), 1)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor) -> Tensor:
        """Scores of paired inputs [..., L] -> [...]."""
        shape = input_ids.shape[:-1]
        output = self.encoder(
            input_ids=input_ids.reshape(-1, input_ids.shape[-1]),
            attention_mask=attention_mask.reshape(-1, attention_mask.shape[-1]),
            token_type_ids=token_type_ids.reshape(-1, token_type_ids.shape[-1]),
        )
        return self.head(self.dropout(output.pooler_output)).reshape(shape)

    def score_candidates(
        self, mention_batch: Mapping[str, Tensor], candidate_batch: Mapping[str, Tensor]
    ) -> Tensor:
        """Each mention against its own candidates ([B*K, Le] or [B, K, Le]) -> [B, K]."""
        batch = mention_batch["input_ids"].shape[0]
        candidates = {
            key: candidate_batch[key].reshape(batch, -1, candidate_batch[key].shape[-1])
            for key in ("input_ids", "attention_mask")
        }
        pairs = cross_encoder_inputs(
            mention_batch,
            candidates,
            self.mention_length,
            self.max_length,
            pad_id=int(self.tokenizer.pad_token_id),
        )
        return self(**pairs)

    def score_matrix(
        self,
        mention_batch: Mapping[str, Tensor],
        candidate_batch: Mapping[str, Tensor],
        pairs: Tensor,
        chunk_size: int = 0,
    ) -> Tensor:
        """Scores [B, C] of mentions [B, Lm] against candidates [C, Le] where ``pairs`` [B, C] is
        True, 0 elsewhere: the training step's scoring call, shared with the bi-encoder.

        A cross-encoder pays one BERT pass per (mention, entity) pair, so only the pairs the loss
        reads are encoded. ``chunk_size`` > 0 runs them that many at a time with activations
        recomputed in the backward pass (:func:`hnce.encoders.towers.checkpointed_chunks`).
        """
        rows, columns = pairs.nonzero(as_tuple=True)
        (scores,) = checkpointed_chunks(
            self._pair_scores,
            [
                mention_batch["input_ids"][rows],
                mention_batch["attention_mask"][rows],
                candidate_batch["input_ids"][columns],
                candidate_batch["attention_mask"][columns],
            ],
            chunk_size,
        )
        return scores.new_zeros(pairs.shape).index_put((rows, columns), scores)

    def _pair_scores(
        self,
        mention_ids: Tensor,
        mention_mask: Tensor,
        candidate_ids: Tensor,
        candidate_mask: Tensor,
    ) -> Tensor:
        """Scores [P] of P (mention, entity) pairs given row by row."""
        return self.score_candidates(
            {"input_ids": mention_ids, "attention_mask": mention_mask},
            {"input_ids": candidate_ids, "attention_mask": candidate_mask},
        )[:, 0]

    def enable_activation_checkpointing(self) -> None:
        """Recompute the encoder's layers in the backward pass (``model.activation_checkpointing``)."""
        enable_activation_checkpointing(self.encoder, "reranker")

    def tokenize_mentions(
        self, context_left: Sequence[str], mention: Sequence[str], context_right: Sequence[str]
    ) -> dict[str, Tensor]:
        """BLINK-formatted mentions, padded to the full mention length as BLINK's cross-encoder expects."""
        return tokenize_mentions(
            self.tokenizer, context_left, mention, context_right, self.mention_length, True
        )

    def tokenize_entities(
        self, titles: Sequence[str | None], texts: Sequence[str]
    ) -> dict[str, Tensor]:
        return tokenize_entities(self.tokenizer, titles, texts, self.entity_length)


def build_reranker(
    model_path_or_config: Path | str | BertConfig,
    tokenizer: object | None = None,
    mention_length: int = 32,
    entity_length: int = 128,
    max_length: int | None = None,
) -> JointReranker:
    """A reranker from a local Hugging Face directory (weights + tokenizer) or a ``BertConfig``
    (random weights; pass a tokenizer). The head starts random."""
    if isinstance(model_path_or_config, BertConfig):
        if tokenizer is None:
            raise ValueError("build_reranker from a BertConfig needs a tokenizer")
        encoder: PreTrainedModel = BertModel(model_path_or_config)
    else:
        path = Path(model_path_or_config)
        encoder = load_local(AutoModel, path)
        if tokenizer is None:
            tokenizer = load_local(AutoTokenizer, path)
    register_markers(tokenizer)
    use_sdpa(encoder, "reranker")
    return JointReranker(encoder, tokenizer, mention_length, entity_length, max_length)


def export_reranker(model: JointReranker, export_dir: Path) -> None:
    """``encoder/`` (``save_pretrained`` + tokenizer), ``reranker.json`` and ``head.safetensors``;
    a write the machine refuses (a full disk) is an ``OSError`` naming ``export_dir``."""
    export_dir = Path(export_dir)
    export_dir.mkdir(parents=True, exist_ok=True)
    description = RerankerDescription(model.mention_length, model.entity_length, model.max_length)
    text = json.dumps(_DESCRIPTION.dump_python(description, mode="json"), indent=2)
    head = {k: v.detach().cpu().contiguous() for k, v in model.head.state_dict().items()}
    with naming_refused_writes(export_dir):
        model.encoder.save_pretrained(export_dir / "encoder")
        model.tokenizer.save_pretrained(export_dir / "encoder")
        (export_dir / RERANKER_FILE).write_text(text + "\n")
        save_file(head, str(export_dir / HEAD_WEIGHTS_FILE))


def load_reranker(export_dir: Path, device: str | torch.device = "cpu") -> JointReranker:
    """Load what ``export_reranker`` wrote."""
    export_dir = Path(export_dir)
    description_path = export_dir / RERANKER_FILE
    try:
        description = read_document(description_path, _DESCRIPTION, "reranker description")
    except DocumentMissing:
        raise DocumentMissing(
            f"{description_path}: missing; not a reranker export directory"
        ) from None
    model = build_reranker(
        export_dir / "encoder",
        mention_length=description.mention_length,
        entity_length=description.entity_length,
        max_length=description.max_length,
    )
    model.head.load_state_dict(load_file(str(export_dir / HEAD_WEIGHTS_FILE)))
    model.eval()
    return model.to(device)
