"""``model.projection_size``: a learned projection after each tower (ColBERT's 128-d token
projection) from the recipe. A fresh model's index vectors have the projected width, the run's
untrained export keeps the projection and reloads to the same vectors, an export continues with
its own, and a conflicting setting is refused naming the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import write_letter_bert

from hnce.encoders.biencoder import BiEncoder, export_biencoder, load_biencoder
from hnce.pipeline.config import ConfigError, load_config
from hnce.pipeline.recipe_models import build_model, untrained_export

WIDTH = 8


@pytest.fixture(scope="module")
def letter_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_letter_bert(tmp_path_factory.mktemp("letter-bert"))


def model_for(path: Path, run_dir: Path, *overrides: str) -> BiEncoder:
    config = load_config(
        None, [f"model.path={path}", f"run.dir={run_dir}", "model.scorer.name=som", *overrides]
    )
    return build_model(config)


def entity_vectors(model: BiEncoder) -> torch.Tensor:
    batch = model.tokenize_entities(["paris", None], ["capital of france", "a river"])
    with torch.no_grad():
        return model.eval().entity_index_vectors(**batch)[0]


def test_a_fresh_model_indexes_vectors_of_the_projected_width(
    letter_bert: Path, tmp_path: Path
) -> None:
    model = model_for(letter_bert, tmp_path, f"model.projection_size={WIDTH}")
    assert model.output_size == WIDTH
    assert entity_vectors(model).shape[1] == WIDTH
    assert entity_vectors(model_for(letter_bert, tmp_path)).shape[1] == 32  # the tower's width


def test_an_untrained_model_encodes_an_entity_alike_through_either_tower(
    letter_bert: Path, tmp_path: Path
) -> None:
    """The two towers start from the same weights, and so do their two projections (equal, yet
    two modules that train apart): an untrained model encodes an entity exactly as its mention
    tower would, so it scores <Px, Py> with one P, a projection of the pretrained geometry. Two
    independently drawn projections score noise (MiniLM on the demo's WordNet: R@1 0.000)."""
    model = model_for(letter_bert, tmp_path, f"model.projection_size={WIDTH}").eval()
    assert model.entity_projection is not model.mention_projection
    batch = model.tokenize_entities(["paris", None], ["capital of france", "a river"])
    with torch.no_grad():
        as_entity, _ = model.encode_entities(**batch)
        as_mention, _ = model.encode_with(model.mention_tower, model.mention_projection, **batch)
    torch.testing.assert_close(as_entity, as_mention, rtol=0, atol=0)


def test_the_untrained_export_keeps_the_projection(letter_bert: Path, tmp_path: Path) -> None:
    config = load_config(
        None,
        [
            f"model.path={letter_bert}",
            f"run.dir={tmp_path}",
            "model.scorer.name=som",
            f"model.projection_size={WIDTH}",
        ],
    )
    export = untrained_export(config)
    assert json.loads((export / "scorer.json").read_text())["projection_size"] == WIDTH
    torch.manual_seed(config.run.seed)  # the projection's weights, as the run draws them
    fresh = entity_vectors(build_model(config))
    torch.testing.assert_close(entity_vectors(load_biencoder(export)), fresh)


def test_an_export_continues_with_its_projection_and_refuses_another(
    letter_bert: Path, tmp_path: Path
) -> None:
    export_biencoder(
        model_for(letter_bert, tmp_path, f"model.projection_size={WIDTH}"), tmp_path / "export"
    )
    assert model_for(tmp_path / "export", tmp_path).projection_size == WIDTH
    assert model_for(tmp_path / "export", tmp_path, f"model.projection_size={WIDTH}")
    with pytest.raises(ConfigError, match=r"model\.projection_size"):
        model_for(tmp_path / "export", tmp_path, "model.projection_size=16")
