"""BiEncoder: trainer entry point, gradients, index vectors, export/reload, the packaged MiniLM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import tiny_bert_config
from transformers import BertConfig

from encoders.biencoder import (
    BiEncoder,
    build_biencoder,
    export_biencoder,
    load_biencoder,
    minilm_path,
)
from encoders.scorers import index_scores


@pytest.fixture(scope="module")
def tiny_config(tiny_tokenizer) -> BertConfig:
    return tiny_bert_config(len(tiny_tokenizer))


def tiny_model(
    tiny_config, tiny_tokenizer, spec: str, projection_size: int | None = None
) -> BiEncoder:
    torch.manual_seed(0)
    return build_biencoder(
        tiny_config,
        spec,
        tokenizer=tiny_tokenizer,
        mention_length=16,
        entity_length=24,
        projection_size=projection_size,
    )


def batches(model: BiEncoder) -> tuple[dict, dict]:
    mentions = model.tokenize_mentions(
        ["the capital of", "a city on the", "big"],
        ["france", "seine", "paris"],
        ["is paris", "", "city ."],
    )
    entities = model.tokenize_entities(
        ["paris", "france", "seine", None], ["capital of france", "big", "river . a river", "city"]
    )
    return mentions, entities


@pytest.mark.parametrize("spec", ["dual", "multi-2", "som", "poly-3", "genpoly-3-2"])
def test_score_with_candidates_matches_all_pairs(spec: str, tiny_config, tiny_tokenizer) -> None:
    model = tiny_model(tiny_config, tiny_tokenizer, spec).eval()
    mentions, entities = batches(model)
    with torch.no_grad():
        all_pairs = model(mentions, entities)
        chosen = torch.tensor([[0, 2, 3], [2, 1, 0], [1, 1, 3]])  # gold first, then K=2 negatives
        flat = {k: v[chosen.reshape(-1)] for k, v in entities.items()}
        per_mention = model.score_with_candidates(mentions, flat)
        shaped = model.score_with_candidates(mentions, {k: v[chosen] for k, v in entities.items()})
    assert per_mention.shape == (3, 3)
    torch.testing.assert_close(per_mention, all_pairs.gather(1, chosen), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(shaped, per_mention)


@pytest.mark.parametrize("spec", ["dual", "som", "poly-3", "genpoly-3-2"])
def test_gradients_reach_both_towers_and_the_codes(spec: str, tiny_config, tiny_tokenizer) -> None:
    model = tiny_model(
        tiny_config, tiny_tokenizer, spec, projection_size=16 if spec == "dual" else None
    )
    mentions, entities = batches(model)
    chosen = torch.tensor([[0, 2, 3], [2, 1, 0], [1, 1, 3]])
    scores = model.score_with_candidates(
        mentions, {k: v[chosen.reshape(-1)] for k, v in entities.items()}
    )
    loss = torch.nn.functional.cross_entropy(scores, torch.zeros(3, dtype=torch.long))  # eq. 5
    loss.backward()
    for tower in (model.mention_tower, model.entity_tower):
        grad = tower.embeddings.word_embeddings.weight.grad
        assert grad is not None and grad.abs().sum() > 0
    for name, parameter in model.scorer.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name
    if spec.startswith(("poly", "genpoly")):
        assert model.scorer.codes.grad.abs().sum() > 0
    if spec == "dual":
        assert model.mention_projection.additional_linear.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("spec", ["dual", "multi-2", "som"])
def test_model_index_vectors_reproduce_scores(spec: str, tiny_config, tiny_tokenizer) -> None:
    model = tiny_model(tiny_config, tiny_tokenizer, spec).eval()
    mentions, entities = batches(model)
    with torch.no_grad():
        vectors, owners = model.entity_index_vectors(**entities)
        queries = model.mention_query_vectors(**mentions)
        expected = model(mentions, entities)
    assert vectors.dtype == torch.float32 and vectors.shape[1] == model.output_size
    torch.testing.assert_close(
        index_scores(queries, vectors, owners, 4), expected, rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize(
    ("spec", "projection"), [("dual", None), ("poly-3", 16), ("genpoly-3-2", None)]
)
def test_export_and_reload_give_the_same_scores(
    spec: str, projection: int | None, tiny_config, tiny_tokenizer, tmp_path: Path
) -> None:
    model = tiny_model(tiny_config, tiny_tokenizer, spec, projection).eval()
    mentions, entities = batches(model)
    export_biencoder(model, tmp_path / "export")
    description = json.loads((tmp_path / "export" / "scorer.json").read_text())
    assert description["scorer"]["name"] == spec.split("-")[0]
    assert (tmp_path / "export" / "mention" / "config.json").is_file()
    assert (tmp_path / "export" / "entity" / "tokenizer.json").is_file()
    has_weights = spec != "dual" or projection is not None
    assert (tmp_path / "export" / "scorer.safetensors").is_file() == has_weights
    reloaded = load_biencoder(tmp_path / "export")
    with torch.no_grad():
        torch.testing.assert_close(reloaded(mentions, entities), model(mentions, entities))
    assert (reloaded.mention_length, reloaded.entity_length) == (16, 24)
    if spec != "dual":
        torch.testing.assert_close(reloaded.scorer.codes, model.scorer.codes)


def test_load_errors_name_the_file(tmp_path: Path, tiny_config, tiny_tokenizer) -> None:
    with pytest.raises(FileNotFoundError, match=r"scorer\.json"):
        load_biencoder(tmp_path)
    model = tiny_model(tiny_config, tiny_tokenizer, "poly-2")
    export_biencoder(model, tmp_path / "export")
    (tmp_path / "export" / "scorer.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"scorer\.safetensors"):
        load_biencoder(tmp_path / "export")


def test_packaged_minilm_loads_as_both_towers() -> None:
    model = build_biencoder(minilm_path(), "dual").eval()
    assert model.mention_tower is not model.entity_tower
    assert model.output_size == 384
    tokenizer = model.tokenizer
    assert len(tokenizer) == 30522
    assert tokenizer.convert_ids_to_tokens([1, 2, 3]) == ["[unused0]", "[unused1]", "[unused2]"]
    mentions = model.tokenize_mentions(["The capital of"], ["France"], ["is Paris."])
    entities = model.tokenize_entities(["Paris"], ["capital of France"])
    ids = mentions["input_ids"][0].tolist()
    assert ids.count(1) == 1 and ids.count(2) == 1
    assert entities["input_ids"][0].tolist()[:3] == [101, 3000, 3]
    with torch.no_grad():
        mention_hidden, _ = model.encode_mentions(**mentions)
        same_text = model.encode_entities(**mentions)[0]
    torch.testing.assert_close(mention_hidden, same_text)  # both towers start from the same weights
    assert mention_hidden.shape == (1, len(ids), 384)
