"""BLINK checkpoints: import, same embeddings, round trip to identical keys, clear key errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import tiny_bert_config
from torch import nn
from transformers import BertConfig, BertModel

from hnce.encoders.blink_checkpoint import (
    CheckpointKeyError,
    export_blink_biencoder,
    export_blink_crossencoder,
    import_blink_biencoder,
    import_blink_crossencoder,
)
from hnce.encoders.reranker import build_reranker


class BlinkBertEncoder(nn.Module):
    """Shape of BLINK's ``ranker_base.BertEncoder``: [CLS] vector, or linear(pooler) with add_linear."""

    def __init__(self, config: BertConfig, output_size: int | None) -> None:
        super().__init__()
        self.bert_model = BertModel(config)
        self.additional_linear = (
            None if output_size is None else nn.Linear(config.hidden_size, output_size)
        )

    def forward(self, token_ids, segment_ids, attention_mask):
        output = self.bert_model(
            input_ids=token_ids, token_type_ids=segment_ids, attention_mask=attention_mask
        )
        if self.additional_linear is None:
            return output.last_hidden_state[:, 0]
        return self.additional_linear(output.pooler_output)


class BlinkBiEncoderModule(nn.Module):
    def __init__(self, config: BertConfig, output_size: int | None) -> None:
        super().__init__()
        self.context_encoder = BlinkBertEncoder(config, output_size)
        self.cand_encoder = BlinkBertEncoder(config, output_size)


class BlinkCrossEncoderModule(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.encoder = BlinkBertEncoder(config, 1)


def blink_input(batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ids = batch["input_ids"]
    return ids, torch.zeros_like(ids), ids != 0  # BLINK's to_bert_input with NULL_IDX 0


@pytest.mark.parametrize("output_size", [None, 16])
def test_blink_biencoder_loads_gives_same_embeddings_and_round_trips(
    output_size: int | None, tiny_tokenizer, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    config = tiny_bert_config(len(tiny_tokenizer))
    blink = BlinkBiEncoderModule(config, output_size).eval()
    checkpoint = tmp_path / "biencoder.bin"
    torch.save(blink.state_dict(), checkpoint)

    model = import_blink_biencoder(checkpoint, config, tokenizer=tiny_tokenizer, scorer="dual")
    mentions = model.tokenize_mentions(
        ["the capital of", "a city on"], ["france", "the seine"], ["is paris", ""]
    )
    entities = model.tokenize_entities(["paris", "seine"], ["capital of france", "a river"])
    with torch.no_grad():
        mention_vectors = model.mention_query_vectors(**mentions)[:, 0]
        entity_vectors, _ = model.entity_index_vectors(**entities)
        torch.testing.assert_close(mention_vectors, blink.context_encoder(*blink_input(mentions)))
        torch.testing.assert_close(entity_vectors, blink.cand_encoder(*blink_input(entities)))
        torch.testing.assert_close(model(mentions, entities), mention_vectors @ entity_vectors.T)

    exported = tmp_path / "exported.bin"
    export_blink_biencoder(model, exported)
    original = blink.state_dict()
    again = torch.load(exported, weights_only=True)
    assert list(again) == list(original)
    for key, value in original.items():
        assert torch.equal(again[key], value), key


def test_truncated_checkpoint_names_missing_keys(tiny_tokenizer, tmp_path: Path) -> None:
    config = tiny_bert_config(len(tiny_tokenizer))
    state = BlinkBiEncoderModule(config, None).state_dict()
    dropped = [k for k in state if k.startswith("cand_encoder.bert_model.encoder.layer.1.")]
    for key in dropped:
        del state[key]
    with pytest.raises(CheckpointKeyError) as error:
        import_blink_biencoder(state, config, tokenizer=tiny_tokenizer)
    assert error.value.missing == sorted(dropped)
    assert error.value.unexpected == []
    assert "cand_encoder.bert_model.encoder.layer.1.attention.self.query.weight" in str(error.value)


def test_mismatched_checkpoint_names_unexpected_keys(tiny_tokenizer, tmp_path: Path) -> None:
    config = tiny_bert_config(len(tiny_tokenizer))
    cross_state = BlinkCrossEncoderModule(config).state_dict()
    path = tmp_path / "cross.bin"
    torch.save(cross_state, path)
    with pytest.raises(CheckpointKeyError) as error:
        import_blink_biencoder(path, config, tokenizer=tiny_tokenizer)
    message = str(error.value)
    assert str(path) in message
    assert "encoder.bert_model.pooler.dense.weight" in error.value.unexpected
    assert "context_encoder.bert_model.pooler.dense.weight" in error.value.missing
    assert "missing keys" in message and "unexpected keys" in message


def test_wrong_size_checkpoint_and_broken_file_are_errors(tiny_tokenizer, tmp_path: Path) -> None:
    state = BlinkBiEncoderModule(
        tiny_bert_config(len(tiny_tokenizer), hidden_size=48), None
    ).state_dict()
    with pytest.raises(ValueError, match="shapes do not match"):
        import_blink_biencoder(
            state, tiny_bert_config(len(tiny_tokenizer)), tokenizer=tiny_tokenizer
        )
    broken = tmp_path / "broken.bin"
    torch.save(
        BlinkBiEncoderModule(tiny_bert_config(len(tiny_tokenizer)), None).state_dict(), broken
    )
    broken.write_bytes(broken.read_bytes()[:1000])
    with pytest.raises(ValueError, match=r"broken\.bin"):
        import_blink_biencoder(
            broken, tiny_bert_config(len(tiny_tokenizer)), tokenizer=tiny_tokenizer
        )


def test_legacy_layer_norm_names_are_accepted(tiny_tokenizer) -> None:
    config = tiny_bert_config(len(tiny_tokenizer))
    state = BlinkBiEncoderModule(config, None).state_dict()
    legacy = {
        k.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
            "LayerNorm.bias", "LayerNorm.beta"
        ): v
        for k, v in state.items()
    }
    model = import_blink_biencoder(legacy, config, tokenizer=tiny_tokenizer)
    assert torch.equal(
        model.mention_tower.embeddings.LayerNorm.weight,
        state["context_encoder.bert_model.embeddings.LayerNorm.weight"],
    )


def test_blink_crossencoder_scores_match_and_round_trip(tiny_tokenizer, tmp_path: Path) -> None:
    torch.manual_seed(1)
    config = tiny_bert_config(len(tiny_tokenizer))
    blink = BlinkCrossEncoderModule(config).eval()
    checkpoint = tmp_path / "crossencoder.bin"
    torch.save(blink.state_dict(), checkpoint)
    reranker = import_blink_crossencoder(
        checkpoint, config, tokenizer=tiny_tokenizer, mention_length=12, entity_length=10
    )
    mentions = reranker.tokenize_mentions(
        ["the capital of", "a"], ["france", "seine"], ["is paris", "river"]
    )
    entities = reranker.tokenize_entities(
        ["paris", "seine", "france"], ["capital of france", "a river", "big"]
    )
    assert mentions["input_ids"].shape == (2, 12)  # BLINK pads the mention block to its full length
    chosen = torch.tensor([[0, 2], [1, 0]])
    with torch.no_grad():
        scores = reranker.score_candidates(mentions, {k: v[chosen] for k, v in entities.items()})
        # BLINK: context ids (padded to 12) + candidate ids without [CLS]; segment 1 after the context
        expected = torch.zeros(2, 2)
        for b in range(2):
            for k in range(2):
                candidate = entities["input_ids"][chosen[b, k]]
                ids = torch.cat([mentions["input_ids"][b], candidate[1:]])[None]
                segments = torch.zeros_like(ids)
                segments[:, 12:] = (ids[:, 12:] > 0).long()
                expected[b, k] = blink.encoder(ids, segments, ids != 0)[0, 0]
    torch.testing.assert_close(scores, expected)

    exported = tmp_path / "exported.bin"
    export_blink_crossencoder(reranker, exported)
    again = torch.load(exported, weights_only=True)
    assert list(again) == list(blink.state_dict())
    assert all(torch.equal(again[k], v) for k, v in blink.state_dict().items())


@pytest.mark.parametrize("chunk_size", [0, 2])
def test_reranker_scores_only_the_pairs_the_loss_reads(chunk_size: int, tiny_tokenizer) -> None:
    """The training step's scoring call: each requested (mention, entity) pair scored as
    ``score_candidates`` scores it, 0 elsewhere, and the same loss and gradients whether the
    pairs run in chunks recomputed in the backward pass or all at once."""
    torch.manual_seed(2)
    config = tiny_bert_config(len(tiny_tokenizer))
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    reranker = build_reranker(config, tiny_tokenizer, mention_length=12, entity_length=10)
    reranker.dropout.p = 0.0
    mentions = reranker.tokenize_mentions(
        ["the capital of", "a"], ["france", "seine"], ["is paris", "river"]
    )
    entities = reranker.tokenize_entities(
        ["paris", "seine", "france"], ["capital of france", "a river", "big"]
    )
    pairs = torch.tensor([[True, False, True], [True, True, False]])
    scores = reranker.score_matrix(mentions, entities, pairs, chunk_size)
    with torch.no_grad():
        per_mention = reranker.score_candidates(
            mentions, {k: v[torch.tensor([[0, 2], [1, 0]])] for k, v in entities.items()}
        )
    torch.testing.assert_close(scores[pairs].detach(), per_mention.reshape(-1)[[0, 1, 3, 2]])
    assert scores[~pairs].eq(0).all()
    loss = -scores[0, 0] + scores[1, 1] ** 2
    loss.backward()
    grads = torch.cat([p.grad.reshape(-1) for p in reranker.parameters() if p.grad is not None])
    reference = build_reranker(config, tiny_tokenizer, mention_length=12, entity_length=10)
    reference.load_state_dict(reranker.state_dict())
    reference.dropout.p = 0.0
    plain = reference.score_matrix(mentions, entities, pairs)
    (-plain[0, 0] + plain[1, 1] ** 2).backward()
    expected = torch.cat([p.grad.reshape(-1) for p in reference.parameters() if p.grad is not None])
    assert grads.abs().max() > 0
    torch.testing.assert_close(grads, expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max()))
