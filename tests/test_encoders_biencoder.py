"""BiEncoder: the training step's scoring call (plain, chunked, checkpointed), gradients, index
vectors, export/reload, the packaged MiniLM."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch
from conftest import tiny_bert_config
from transformers import AutoConfig, BertConfig

from hnce.encoders.biencoder import (
    BiEncoder,
    build_biencoder,
    export_biencoder,
    load_biencoder,
    minilm_path,
)
from hnce.encoders.local import load_local
from hnce.encoders.scorers import index_scores
from hnce.errors import InputError


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


@pytest.mark.parametrize("spec", ["dual", "som", "poly-3", "genpoly-3-2"])
def test_gradients_reach_both_towers_and_the_codes(spec: str, tiny_config, tiny_tokenizer) -> None:
    model = tiny_model(
        tiny_config, tiny_tokenizer, spec, projection_size=16 if spec == "dual" else None
    )
    mentions, entities = batches(model)
    scores = model.score_matrix(mentions, entities)
    gold = torch.tensor([0, 2, 1])
    loss = torch.nn.functional.cross_entropy(scores, gold)  # eq. 5 against every entity
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


def still_config(tiny_config: BertConfig) -> BertConfig:
    """The tiny config without dropout, so a train-mode pass is deterministic."""
    config = BertConfig.from_dict(tiny_config.to_dict())
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    return config


def loss_and_gradients(
    model: BiEncoder, chunk_size: int
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    mentions, entities = batches(model)
    model.zero_grad()
    scores = model.score_matrix(mentions, entities, chunk_size=chunk_size)
    loss = torch.nn.functional.cross_entropy(scores, torch.tensor([0, 2, 1]))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


@pytest.mark.parametrize("spec", ["dual", "multi-2"])
@pytest.mark.parametrize(
    ("chunk_size", "checkpointing"), [(1, False), (3, False), (0, True), (2, True)]
)
def test_chunked_and_checkpointed_candidates_give_the_plain_loss_and_gradients(
    spec: str, chunk_size: int, checkpointing: bool, tiny_config, tiny_tokenizer
) -> None:
    """Candidates encoded in chunks recomputed in the backward pass, and towers with activation
    checkpointing, change memory, not the loss or any gradient (fp32 tolerance)."""
    plain = tiny_model(still_config(tiny_config), tiny_tokenizer, spec).train()
    expected_loss, expected = loss_and_gradients(plain, chunk_size=0)
    model = tiny_model(still_config(tiny_config), tiny_tokenizer, spec).train()
    if checkpointing:
        model.enable_activation_checkpointing()
        assert model.entity_tower.is_activation_checkpointing
    loss, grads = loss_and_gradients(model, chunk_size)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-6, atol=1e-6)
    assert grads.keys() == expected.keys() and len(grads) > 20
    # Float noise relative to the largest gradient (some, like the key biases, are 0 exactly).
    scale = max(float(grad.abs().max()) for grad in expected.values())
    for name, grad in expected.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-4 * scale, msg=name)


def test_chunked_candidates_recompute_instead_of_keeping_activations(
    tiny_config, tiny_tokenizer
) -> None:
    """With chunks, the entity tower runs twice per chunk (forward, then recomputed in the
    backward pass); without, once: the activations are not kept."""
    model = tiny_model(still_config(tiny_config), tiny_tokenizer, "dual").train()
    calls = []
    model.entity_tower.embeddings.register_forward_hook(lambda *_: calls.append(1))
    for chunk_size, tower_runs in ((0, 1), (2, 4)):
        calls.clear()
        loss_and_gradients(model, chunk_size)
        assert len(calls) == tower_runs, chunk_size


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


def test_a_format_1_export_of_a_named_scorer_reads_and_a_general_one_is_refused(
    tiny_config, tiny_tokenizer, tmp_path: Path
) -> None:
    """Format 1 spelled the general form's choices out beside the scorer's name: an export whose
    choices are its name's reloads to the same scores; one whose choices are not (the open
    general form no recipe names now) is refused naming its file."""
    model = tiny_model(tiny_config, tiny_tokenizer, "poly-3", None).eval()
    export_biencoder(model, tmp_path / "export")
    path = tmp_path / "export" / "scorer.json"
    description = json.loads(path.read_text())
    old = {"query_side": "entity", "query_reduction": "leftmost", "key_reduction": "codes"}
    description.update(format=1, scorer={**description["scorer"], **old, "attention": "soft"})
    path.write_text(json.dumps(description))
    mentions, entities = batches(model)
    with torch.no_grad():
        torch.testing.assert_close(
            load_biencoder(tmp_path / "export")(mentions, entities), model(mentions, entities)
        )
    description["scorer"]["attention"] = "hard"
    path.write_text(json.dumps(description))
    with pytest.raises(InputError, match=r"scorer\.json.*format 1 scorer poly with general-form"):
        load_biencoder(tmp_path / "export")


def shared_and_two_towers(tiny_config, tiny_tokenizer) -> tuple[BiEncoder, BiEncoder]:
    """A shared-tower model and a two-tower one whose towers (and projections) all hold the
    shared model's weights, in eval mode (no dropout; gradients still flow): the same function
    of their inputs."""
    torch.manual_seed(0)
    shared = build_biencoder(
        tiny_config, "dual", tokenizer=tiny_tokenizer, projection_size=16, shared_towers=True
    )
    two = build_biencoder(tiny_config, "dual", tokenizer=tiny_tokenizer, projection_size=16)
    for tower in (two.mention_tower, two.entity_tower):
        tower.load_state_dict(shared.mention_tower.state_dict())
    for projection in (two.mention_projection, two.entity_projection):
        projection.load_state_dict(shared.mention_projection.state_dict())
    return shared.eval(), two.eval()


def test_shared_towers_are_one_module_whose_gradient_sums_both_sides(
    tiny_config, tiny_tokenizer
) -> None:
    """One tower for mentions and entities: its parameters count once, it scores as two equal
    towers would, and its gradient is the mention side's plus the entity side's."""
    shared, two = shared_and_two_towers(tiny_config, tiny_tokenizer)
    assert shared.shared_towers and not two.shared_towers
    assert shared.entity_projection is shared.mention_projection

    def count(modules: list[torch.nn.Module]) -> int:
        return sum(p.numel() for module in modules for p in module.parameters())

    assert count([shared]) == count([two.mention_tower, two.mention_projection])
    assert count([two]) == 2 * count([shared])
    mentions, entities = batches(shared)
    gold = torch.tensor([0, 2, 1])
    for model in (shared, two):
        torch.nn.functional.cross_entropy(model(mentions, entities), gold).backward()
    torch.testing.assert_close(shared(mentions, entities), two(mentions, entities))
    for name, parameter in shared.mention_tower.named_parameters():
        if parameter.grad is None:  # the unused pooler
            continue
        both = (
            two.mention_tower.get_parameter(name).grad + two.entity_tower.get_parameter(name).grad
        )
        torch.testing.assert_close(parameter.grad, both, rtol=1e-5, atol=1e-6)
    weight = "additional_linear.weight"
    torch.testing.assert_close(
        shared.mention_projection.get_parameter(weight).grad,
        two.mention_projection.get_parameter(weight).grad
        + two.entity_projection.get_parameter(weight).grad,
        rtol=1e-5,
        atol=1e-6,
    )


def test_shared_towers_export_both_directories_and_reload_as_one(
    tiny_config, tiny_tokenizer, tmp_path: Path
) -> None:
    shared, _ = shared_and_two_towers(tiny_config, tiny_tokenizer)
    export_biencoder(shared, tmp_path / "export")
    description = json.loads((tmp_path / "export" / "scorer.json").read_text())
    assert description["shared_towers"] is True
    assert (tmp_path / "export" / "entity" / "config.json").is_file()  # plain transformers
    reloaded = load_biencoder(tmp_path / "export")
    assert reloaded.entity_tower is reloaded.mention_tower
    assert reloaded.entity_projection is reloaded.mention_projection
    mentions, entities = batches(shared)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(mentions, entities), shared(mentions, entities))


@pytest.mark.parametrize("tower", ["mention", "entity"])
def test_an_export_with_a_non_finite_weight_is_refused(
    tower: str, tiny_config, tiny_tokenizer, tmp_path: Path
) -> None:
    model = tiny_model(tiny_config, tiny_tokenizer, "dual").eval()
    with torch.no_grad():
        getattr(model, f"{tower}_tower").embeddings.word_embeddings.weight[3, 0] = float("nan")
    export_biencoder(model, tmp_path / "export")
    with pytest.raises(
        InputError, match=rf"export/{tower}/model\.safetensors: weight .*not finite"
    ):
        load_biencoder(tmp_path / "export")


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


@pytest.mark.parametrize("missing", ["no-such-dir", "bert-base-uncased"])
def test_a_model_path_that_is_not_a_local_directory_never_reaches_the_hub(
    missing: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A missing directory, or a Hub repository name, fails at once saying what to pass; no
    network call is attempted (every socket connection fails the test)."""

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model load tried the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=rf"{missing}: not a local model directory"):
        build_biencoder(missing, "dual")


@pytest.mark.parametrize(
    "config",
    [b"{", b'{"model_type": "bert", "hidden_size": "wide"}', b'{"model_type": "bert"}\xff'],
    ids=["cut short", "wrong type", "not utf-8"],
)
def test_a_model_directory_whose_files_do_not_load_is_one_error_naming_it(
    config: bytes, tmp_path: Path
) -> None:
    """What ``from_pretrained`` raises of a config it cannot read (OSError without an errno,
    ValueError, a strict dataclass error) is the user's: one line naming the directory."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_bytes(config)
    with pytest.raises(InputError, match=rf"{tmp_path / 'model'}: AutoConfig cannot load it: "):
        load_local(AutoConfig, tmp_path / "model")
