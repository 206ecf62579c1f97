"""Configs fail before any work with a message naming the key; the recipes load."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config import Config, ConfigError, config_from_dict, load_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("recipe", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_recipe_loads(recipe: Path) -> None:
    assert isinstance(load_config(recipe), Config)


def test_values_and_overrides(tmp_path: Path) -> None:
    path = write(
        tmp_path, "training:\n  steps: 50\n  learning_rate: 1\nnegatives:\n  sampler: hard\n"
    )
    config = load_config(
        path, ["training.steps=7", "loss.name=triplet", "loss.options={margin: 0.5}"]
    )
    assert config.training.steps == 7
    assert config.training.learning_rate == 1.0 and isinstance(config.training.learning_rate, float)
    assert config.negatives.sampler == "hard"
    assert config.loss.options == {"margin": 0.5}
    assert config_from_dict(config.to_dict()) == config


def test_unknown_key_names_key_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "run:\n  seed: 1\ntraining:\n  steps: 5\n  stpes: 9\n")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert "training.stpes" in str(error.value)
    assert f"{path}:5" in str(error.value)


def test_unknown_section(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown key 'trainer'"):
        load_config(write(tmp_path, "trainer:\n  steps: 5\n"))


def test_wrong_type_names_key_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "training:\n  steps: many\n")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert "'training.steps' must be int" in str(error.value)
    assert f"{path}:2" in str(error.value)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("training.steps=ten", "training.steps"),
        ("training.steps=true", "training.steps"),
        ("eval.ks=[1, x]", "eval.ks[1]"),
        ("model.scorer=dual", "model.scorer"),
        ("refresh.enabled=3", "refresh.enabled"),
        ("training.zero_stage=5", "training.zero_stage"),
        ("negatives.hard_fraction=1.5", "negatives.hard_fraction"),
        ("training.batch_size=0", "training.batch_size"),
        ("cluster.adress=auto", "cluster.adress"),
        ("negatives.sampler=lexical", "negatives.sampler"),
        ("negatives.sampler=hardest", "negatives.sampler"),
        ("loss.name=hinge", "loss.name"),
        ("index.faiss_device=tpu", "index.faiss_device"),
        ("refresh.shard_size=0", "refresh.shard_size"),
        ("loss.options={gamma: 2}", "loss.options"),
    ],
)
def test_bad_override_names_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(None, [override])
    assert key in str(error.value)


@pytest.mark.parametrize("scorer", ["poly", "genpoly", "joint"])
def test_non_indexable_scorer_cannot_mine_from_index(scorer: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(None, [f"model.scorer.name={scorer}", "negatives.source=index"])
    assert "model.scorer.name" in str(error.value) and "negatives.source" in str(error.value)


def test_non_indexable_scorer_with_random_negatives_is_fine() -> None:
    config = load_config(
        None, ["model.scorer.name=poly", "negatives.source=none", "negatives.sampler=random"]
    )
    assert config.model.scorer.name == "poly"


def test_hard_sampler_needs_index_source() -> None:
    with pytest.raises(ConfigError, match=r"negatives\.source"):
        load_config(None, ["negatives.sampler=hard", "negatives.source=none"])


def test_malformed_override_and_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"section\.key=value"):
        load_config(None, ["training.steps"])
    with pytest.raises(ConfigError, match="top level"):
        load_config(write(tmp_path, "- a\n- b\n"))
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "training: [\n"))
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")


def test_yaml_is_loaded_safely(tmp_path: Path) -> None:
    path = write(tmp_path, "run:\n  dir: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)
