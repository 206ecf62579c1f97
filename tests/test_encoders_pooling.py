"""Pooling that follows the model: mean equals the masked mean, auto reads sentence-transformers'
declaration, BLINK stays [CLS], exports keep the pooling, bad declarations name their file, and
the demo's untrained row pools as the model declares; ``model.normalize`` makes scores
cosines and is kept by exports, refused by BLINK's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import tiny_bert_config, write_letter_bert

from hnce.encoders.biencoder import (
    BiEncoder,
    build_biencoder,
    export_biencoder,
    load_biencoder,
    minilm_path,
)
from hnce.encoders.blink_checkpoint import export_blink_biencoder, import_blink_biencoder
from hnce.encoders.pooling import declared_pooling, resolve_pooling
from hnce.errors import InputError
from hnce.pipeline.config import ConfigError, load_config
from hnce.pipeline.recipe_models import build_model, untrained_export

MEAN_MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {
        "idx": 2,
        "name": "2",
        "path": "2_Normalize",
        "type": "sentence_transformers.models.Normalize",
    },
]


def declare(directory: Path, modes: dict[str, bool], modules: list[dict] | None = None) -> Path:
    """Write a sentence-transformers pooling declaration into ``directory``."""
    (directory / "modules.json").write_text(json.dumps(modules or MEAN_MODULES, indent=2))
    (directory / "1_Pooling").mkdir(exist_ok=True)
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(modes, indent=2))
    return directory


MEAN = {"pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True}
# sentence-transformers 6 writes other module types and a named mode.
V6_MODULES = [
    {"path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"},
    {
        "path": "1_Pooling",
        "type": "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
    },
    {"path": "2_Normalize", "type": "sentence_transformers.base.modules.normalize.Normalize"},
]


@pytest.fixture(scope="module")
def mean_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BERT directory that declares mean pooling as all-MiniLM-L6-v2 does."""
    return declare(write_letter_bert(tmp_path_factory.mktemp("mean-bert")), MEAN)


def tiny_model(tiny_tokenizer, pooling: str, scorer: str = "dual") -> BiEncoder:
    torch.manual_seed(0)
    config = tiny_bert_config(len(tiny_tokenizer))
    return build_biencoder(config, scorer, tokenizer=tiny_tokenizer, pooling=pooling).eval()


def padded_entities(model: BiEncoder) -> dict[str, torch.Tensor]:
    batch = model.tokenize_entities(
        ["paris", "seine", None], ["capital of france is a big city", "river", "city"]
    )
    assert not batch["attention_mask"].bool().all()  # the batch has padding to exclude
    return batch


def test_mean_pooling_is_the_masked_mean_of_the_token_states(tiny_tokenizer) -> None:
    model = tiny_model(tiny_tokenizer, "mean", "multi-3")
    batch = padded_entities(model)
    with torch.no_grad():
        states = model.entity_tower(**batch).last_hidden_state
        hidden, _ = model.encode_entities(batch["input_ids"], batch["attention_mask"])
    width = batch["attention_mask"].shape[1]
    for row, length in enumerate(batch["attention_mask"].sum(1).tolist()):
        expected = states[row, :length].sum(0) / length
        assert torch.equal(hidden[row, 0], expected)
        if length < width:  # the padded states would change the mean: they are excluded
            assert not torch.allclose(hidden[row, 0], states[row].mean(0), atol=1e-4)
    assert torch.equal(hidden[:, 1:], states[:, 1:])  # the other positions keep token states


def test_cls_pooling_keeps_the_cls_state(tiny_tokenizer) -> None:
    model = tiny_model(tiny_tokenizer, "auto")
    assert model.pooling == "cls"  # a BertConfig declares nothing: [CLS]
    batch = padded_entities(model)
    with torch.no_grad():
        states = model.entity_tower(**batch).last_hidden_state
        hidden, _ = model.encode_entities(batch["input_ids"], batch["attention_mask"])
    assert torch.equal(hidden, states)


def test_auto_reads_the_declared_pooling(tmp_path: Path) -> None:
    assert declared_pooling(minilm_path()) == "mean"
    assert resolve_pooling("auto", minilm_path()) == "mean"
    assert resolve_pooling("cls", minilm_path()) == "cls"
    assert resolve_pooling("auto", tmp_path) == "cls"  # no modules.json: BLINK's [CLS]
    cls_dir = declare(tmp_path, {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False})
    assert declared_pooling(cls_dir) == "cls"
    assert declared_pooling(declare(tmp_path, {"pooling_mode": "mean"}, V6_MODULES)) == "mean"
    assert declared_pooling(declare(tmp_path, {"pooling_mode": "cls"}, V6_MODULES)) == "cls"


def test_minilm_builds_mean_pooled(tmp_path: Path) -> None:
    config = load_config(None, ["model.path=minilm", f"run.dir={tmp_path}"])
    assert build_model(config).pooling == "mean"


@pytest.mark.parametrize(
    ("modes", "modules", "named"),
    [
        ({"pooling_mode_max_tokens": True}, None, "1_Pooling/config.json"),
        ({**MEAN, "pooling_mode_cls_token": True}, None, "1_Pooling/config.json"),
        ({"pooling_mode_weird": True}, None, "1_Pooling/config.json"),
        ({}, None, "1_Pooling/config.json"),
        ({"pooling_mode": "max"}, V6_MODULES, "1_Pooling/config.json"),
        (
            MEAN,
            [*MEAN_MODULES, {"path": "2_Dense", "type": "sentence_transformers.models.Dense"}],
            "modules.json",
        ),
        (MEAN, MEAN_MODULES[:1], "modules.json"),
    ],
)
def test_a_bad_declaration_is_an_error_naming_the_file(
    modes: dict, modules: list[dict] | None, named: str, tmp_path: Path
) -> None:
    declare(tmp_path, modes, modules)
    with pytest.raises(InputError, match=str(tmp_path / named)):
        declared_pooling(tmp_path)


def test_malformed_modules_json_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "modules.json").write_text('[\n  {"type": "x",}\n]\n')
    with pytest.raises(InputError, match=rf"{tmp_path / 'modules.json'}:2: invalid .* JSON"):
        declared_pooling(tmp_path)


def test_export_and_load_keep_the_pooling(tiny_tokenizer, tmp_path: Path) -> None:
    model = tiny_model(tiny_tokenizer, "mean")
    export_biencoder(model, tmp_path)
    assert json.loads((tmp_path / "scorer.json").read_text())["pooling"] == "mean"
    reloaded = load_biencoder(tmp_path)
    assert reloaded.pooling == "mean"
    batch = padded_entities(model)
    with torch.no_grad():
        torch.testing.assert_close(
            reloaded.entity_index_vectors(**batch)[0], model.entity_index_vectors(**batch)[0]
        )


def test_blink_import_pools_cls_and_export_refuses_mean(mean_bert: Path, tmp_path: Path) -> None:
    base = build_biencoder(mean_bert, "dual", mention_length=16, entity_length=16)
    assert base.pooling == "mean"
    with pytest.raises(ValueError, match="BLINK pools \\[CLS\\]; this model pools mean"):
        export_blink_biencoder(base, tmp_path / "refused.bin")
    base.pooling = "cls"
    export_blink_biencoder(base, tmp_path / "blink.bin")
    imported = import_blink_biencoder(tmp_path / "blink.bin", mean_bert)  # base declares mean
    assert imported.pooling == "cls"
    export_biencoder(imported, tmp_path / "export")
    assert load_biencoder(tmp_path / "export").pooling == "cls"


def test_an_export_keeps_its_pooling_and_a_conflicting_setting_is_refused(
    mean_bert: Path, tmp_path: Path
) -> None:
    export_biencoder(build_biencoder(mean_bert, "dual"), tmp_path / "export")
    config = load_config(None, [f"model.path={tmp_path / 'export'}", f"run.dir={tmp_path}"])
    assert build_model(config).pooling == "mean"
    config = load_config(
        None, [f"model.path={tmp_path / 'export'}", "model.pooling=cls", f"run.dir={tmp_path}"]
    )
    with pytest.raises(ConfigError, match=r"model\.pooling"):
        build_model(config)


@pytest.mark.parametrize(("setting", "expected"), [("auto", "mean"), ("cls", "cls")])
def test_the_untrained_row_pools_as_the_model_declares(
    setting: str, expected: str, mean_bert: Path, tmp_path: Path
) -> None:
    model_dir = shutil.copytree(mean_bert, tmp_path / "model")
    config = load_config(
        None, [f"model.path={model_dir}", f"model.pooling={setting}", f"run.dir={tmp_path}"]
    )
    assert load_biencoder(untrained_export(config)).pooling == expected


# --------------------------------------------------------------------------------------------
# model.normalize: cosine scores


def with_normalize(model: BiEncoder) -> BiEncoder:
    """The same weights with every vector L2-normalised."""
    model.normalize = True
    return model


def test_normalized_dual_scores_are_the_cosines_of_the_unnormalised_vectors(
    tiny_tokenizer,
) -> None:
    plain, normalized = (tiny_model(tiny_tokenizer, "mean") for _ in range(2))
    with_normalize(normalized)
    mentions = plain.tokenize_mentions(["the capital of", "a"], ["paris", "river"], ["is", "big"])
    entities = padded_entities(plain)
    with torch.no_grad():
        x = plain.encode_mentions(**mentions)[0][:, 0]
        y = plain.encode_entities(**entities)[0][:, 0]
        cosines = torch.nn.functional.cosine_similarity(x[:, None], y[None], dim=-1)
        torch.testing.assert_close(normalized(mentions, entities), cosines)
        assert not torch.allclose(plain(mentions, entities), cosines)


def test_normalized_sum_of_max_is_a_sum_of_maximal_token_cosines(tiny_tokenizer) -> None:
    """som over unit vectors (ColBERT's late interaction): every score is bounded by the
    number of real mention tokens, and each entity's vectors, padding aside, have norm 1."""
    model = with_normalize(tiny_model(tiny_tokenizer, "cls", "som"))
    mentions = model.tokenize_mentions(["the capital of"], ["paris"], ["is a big city"])
    entities = padded_entities(model)
    with torch.no_grad():
        vectors, mask = model.encode_entities(**entities)
        scores = model(mentions, entities)
    norms = vectors.norm(dim=-1)[mask.bool()]
    torch.testing.assert_close(norms, torch.ones_like(norms))
    assert (scores.abs() <= mentions["attention_mask"].sum() + 1e-4).all()


def test_export_keeps_normalize_and_blink_refuses_it(tiny_tokenizer, tmp_path: Path) -> None:
    model = with_normalize(tiny_model(tiny_tokenizer, "cls"))
    export_biencoder(model, tmp_path / "export")
    assert json.loads((tmp_path / "export" / "scorer.json").read_text())["normalize"] is True
    reloaded = load_biencoder(tmp_path / "export")
    assert reloaded.normalize
    batch = padded_entities(model)
    with torch.no_grad():
        torch.testing.assert_close(
            reloaded.entity_index_vectors(**batch)[0], model.entity_index_vectors(**batch)[0]
        )
    with pytest.raises(ValueError, match="BLINK scores unnormalised inner products"):
        export_blink_biencoder(model, tmp_path / "refused.bin")


def test_normalize_follows_the_recipe_or_the_export(mean_bert: Path, tmp_path: Path) -> None:
    def model_for(path: Path, *overrides: str) -> BiEncoder:
        return build_model(
            load_config(None, [f"model.path={path}", f"run.dir={tmp_path}", *overrides])
        )

    assert model_for(mean_bert).normalize  # a fresh model: cosine, the measured default
    assert not model_for(mean_bert, "model.normalize=false").normalize  # eq. 9 as written
    export_biencoder(model_for(mean_bert, "model.normalize=false"), tmp_path / "export")
    assert not model_for(tmp_path / "export").normalize  # unset: the export's own
    with pytest.raises(ConfigError, match=r"model\.normalize"):
        model_for(tmp_path / "export", "model.normalize=true")
