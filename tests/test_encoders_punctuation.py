"""``model.scorer.skip_punctuation``: ColBERT's skiplist. The entity tower still reads punctuation,
but its vectors leave the mask, so sum-of-max neither scores nor stores them, in training, in the
index and after an export."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import tiny_bert_config

from hnce.encoders.biencoder import BiEncoder, build_biencoder, export_biencoder, load_biencoder
from hnce.encoders.formatting import punctuation_ids
from hnce.encoders.scorers import ScorerConfig
from hnce.pipeline.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]
TITLES = ["paris", "seine"]
TEXTS = ["capital . of . france", "river . a river"]


def som_model(tiny_tokenizer, skip: bool) -> BiEncoder:
    torch.manual_seed(0)
    return build_biencoder(
        tiny_bert_config(len(tiny_tokenizer)),
        ScorerConfig(name="som", skip_punctuation=skip),
        tokenizer=tiny_tokenizer,
        mention_length=16,
        entity_length=24,
    ).eval()


def test_punctuation_ids_are_the_single_punctuation_tokens(tiny_tokenizer) -> None:
    assert punctuation_ids(tiny_tokenizer) == [tiny_tokenizer.convert_tokens_to_ids(".")]


def test_skipped_tokens_are_neither_stored_nor_scored(tiny_tokenizer) -> None:
    kept_all, skipping = som_model(tiny_tokenizer, False), som_model(tiny_tokenizer, True)
    entities = kept_all.tokenize_entities(TITLES, TEXTS)
    mentions = kept_all.tokenize_mentions(["the capital"], ["paris"], ["is big"])
    dot = tiny_tokenizer.convert_tokens_to_ids(".")
    real = entities["attention_mask"].bool()
    wanted = real & entities["input_ids"].ne(dot)
    with torch.no_grad():
        hidden, _ = kept_all.encode_entities(**entities)
        all_vectors, _ = kept_all.entity_index_vectors(**entities)
        vectors, rows = skipping.entity_index_vectors(**entities)
        scores = skipping(mentions, entities)
        full_scores = kept_all(mentions, entities)
        queries, _ = kept_all.encode_mentions(**mentions)
    assert len(all_vectors) == int(real.sum())
    assert len(vectors) == int(wanted.sum()) == len(all_vectors) - 3
    torch.testing.assert_close(vectors, hidden[wanted].float())
    assert torch.equal(rows, torch.arange(2)[:, None].expand_as(wanted)[wanted])
    query = queries[0][mentions["attention_mask"][0].bool()]
    expected = torch.stack(
        [(query @ hidden[e][wanted[e]].T).amax(-1).sum() for e in range(len(TITLES))]
    )
    torch.testing.assert_close(scores[0], expected)
    assert not torch.allclose(scores, full_scores)


def test_an_export_keeps_the_skiplist(tiny_tokenizer, tmp_path: Path) -> None:
    model = som_model(tiny_tokenizer, True)
    export_biencoder(model, tmp_path / "export")
    loaded = load_biencoder(tmp_path / "export")
    entities = model.tokenize_entities(TITLES, TEXTS)
    assert loaded.scorer.config.skip_punctuation
    assert torch.equal(loaded.skipped_entity_tokens, model.skipped_entity_tokens)
    assert len(model.skipped_entity_tokens) == 1
    with torch.no_grad():
        expected, loaded_vectors = (
            model.entity_index_vectors(**entities),
            loaded.entity_index_vectors(**entities),
        )
    for left, right in zip(expected, loaded_vectors, strict=True):
        torch.testing.assert_close(left, right)


@pytest.mark.parametrize("scorer", ["dual", "poly"])
def test_scorers_that_read_only_the_first_entity_vector_refuse_it(scorer: str) -> None:
    with pytest.raises(ValueError, match="skip_punctuation"):
        ScorerConfig(name=scorer, skip_punctuation=True)
    with pytest.raises(ConfigError, match=r"'model\.scorer': skip_punctuation"):
        load_config(
            ROOT / "configs" / "synthetic-test.yaml",
            [f"model.scorer.name={scorer}", "model.scorer.skip_punctuation=true"],
        )
