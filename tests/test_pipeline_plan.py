"""``hnce plan``: the estimator's arithmetic on hand-computed cases, its parameter counts against
real models, and the recipes' claims (aida-blink fits a 24 GB GPU). Its figures against measured
peaks of real steps: benchmarks/plan_memory.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import tiny_bert_config, write_wordpiece_tokenizer
from transformers import BertModel

from hnce.encoders.scorers import ScorerConfig
from hnce.pipeline.cli.main import main
from hnce.pipeline.config import load_config
from hnce.pipeline.plan import (
    GIB,
    ZERO_BUCKET_ELEMENTS,
    Encoder,
    entity_vectors_kept,
    model_states,
    plan_memory,
)

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_layer_and_tower_activations_by_hand() -> None:
    """3 sequences of 2 tokens, hidden 4, 2 heads, fp32: n·s·h = 24 elements, n·a·s² = 24."""
    encoder = Encoder(parameters=0, hidden=4, layers=3, heads=2)
    # 16·24 elements + 2·24 probabilities, 4 B each, + 2·24 + 24 mask bytes
    assert encoder.layer_bytes(3, 2, element=4, fused=False) == (16 * 24 + 2 * 24) * 4 + 72
    assert encoder.layer_bytes(3, 2, element=4, fused=True) == 16 * 24 * 4 + 48
    assert encoder.layer_bytes(3, 2, element=2, fused=True) == 16 * 24 * 2 + 48
    edges = 3 * 24 * 4 + 24
    layer = 1800
    assert encoder.tower_bytes(3, 2, 4, fused=False, checkpointing=False) == edges + 4 * layer
    assert encoder.tower_bytes(3, 2, 4, fused=False, checkpointing=True) == (
        edges + 3 * 24 * 4 + layer
    )


def test_model_states_per_zero_stage_by_hand() -> None:
    def sizes(stage: int, ranks: int, mixed: bool) -> dict[str, int]:
        return {line.name: line.size for line in model_states(1000, stage, ranks, mixed)}

    assert sizes(0, 4, mixed=False) == {
        "parameters": 4000,
        "gradients": 4000,
        "optimizer states": 8000,
    }
    assert sizes(1, 4, mixed=True) == {
        "parameters": 2000,
        "gradients": 2000,
        "optimizer states": 3000,
    }
    assert sizes(2, 4, mixed=True) == {
        "parameters": 2000,
        "gradients": 500,
        "optimizer states": 3000,
        "ZeRO buckets": 2 * ZERO_BUCKET_ELEMENTS * 2,
    }
    assert sizes(3, 8, mixed=True)["parameters"] == 250


@pytest.mark.parametrize(
    ("spec", "vectors"),
    [("dual", 1), ("multi-8", 8), ("som", 64), ("poly-16", 1), ("genpoly-16-4", 4)],
)
def test_a_candidate_chunk_keeps_what_the_scorer_reads(spec: str, vectors: int) -> None:
    assert entity_vectors_kept(ScorerConfig.parse(spec), entity_length=64) == vectors


def test_plan_counts_the_real_parameters_and_chunks_the_candidates(tmp_path: Path) -> None:
    tokenizer = write_wordpiece_tokenizer(tmp_path, ["a", "b"])
    architecture = tiny_bert_config(len(tokenizer))
    BertModel(architecture).save_pretrained(tmp_path)
    tower = sum(p.numel() for p in BertModel(architecture).parameters())
    config = load_config(
        None,
        [
            f"model.path={tmp_path}",
            "model.scorer.name=poly",
            "model.scorer.m=4",
            "model.entity_length=16",
            "training.batch_size=2",
            "negatives.num_negatives=7",
            "training.candidate_chunk_size=4",
            "training.zero_stage=0",
            "negatives.source=none",
            "negatives.sampler=random",
        ],
    )
    plan = plan_memory(config, "retriever", 1000)
    figures = {line.name: line.size for line in plan.trainer}
    parameters = 2 * tower + 4 * 32  # two towers and the poly codes
    assert figures["parameters"] == 4 * parameters
    encoder = Encoder(tower, hidden=32, layers=2, heads=2)
    kept = 16 * 1 * 32 * 4  # 16 candidates x y_1 (poly) x 32 dims x fp32
    assert figures["candidate tower"] == kept + encoder.tower_bytes(4, 16, 4, False, False)
    assert {line.name: line.size for line in plan.index}["whole index"] == 1000 * 32 * 4
    assert Encoder.from_config(architecture).parameters == tower


@pytest.mark.parametrize(("kind", "copied"), [("flat", False), ("ivfpq", True), ("hnsw", True)])
def test_a_compressed_multi_m_index_lists_its_vector_copy_on_disk(
    tmp_path: Path, kind: str, copied: bool
) -> None:
    """multi-8 over 32-wide towers: a compressed index keeps 1,000 x 8 x 32 x 2 B of float16 copy
    on disk beside its codes; a flat one needs none."""
    tokenizer = write_wordpiece_tokenizer(tmp_path, ["a", "b"])
    BertModel(tiny_bert_config(len(tokenizer))).save_pretrained(tmp_path)
    config = load_config(
        None,
        [
            f"model.path={tmp_path}",
            "model.scorer.name=multi",
            "model.scorer.m=8",
            f"index.kind={kind}",
        ],
    )
    index = {line.name: line.size for line in plan_memory(config, "retriever", 1000).index}
    assert index.get("vector copy") == (1000 * 8 * 32 * 2 if copied else None)


def test_a_projection_counts_its_weights_and_narrows_the_index(tmp_path: Path) -> None:
    """model.projection_size 8 on 32-wide towers: two projections of (32 + 1) x 8 weights, poly
    codes of width 8, and index vectors of 8 dimensions; with model.shared_towers one tower and
    one projection."""
    tokenizer = write_wordpiece_tokenizer(tmp_path, ["a", "b"])
    architecture = tiny_bert_config(len(tokenizer))
    BertModel(architecture).save_pretrained(tmp_path)
    tower = sum(p.numel() for p in BertModel(architecture).parameters())
    overrides = [f"model.path={tmp_path}", "model.scorer.name=poly", "model.scorer.m=4"]
    config = load_config(None, [*overrides, "model.projection_size=8"])
    plan = plan_memory(config, "retriever", 1000)
    parameters = 2 * tower + 2 * 33 * 8 + 4 * 8
    assert {line.name: line.size for line in plan.trainer}["parameters"] == 4 * parameters
    assert {line.name: line.size for line in plan.index}["whole index"] == 1000 * 8 * 4
    one = plan_memory(
        load_config(None, [*overrides, "model.projection_size=8", "model.shared_towers=true"]),
        "retriever",
        1000,
    )
    shared = tower + 33 * 8 + 4 * 8  # one tower, one projection
    assert {line.name: line.size for line in one.trainer}["parameters"] == 4 * shared


def test_compressed_sum_of_max_plans_its_codes_not_its_vectors(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Sum-of-max over ivfpq: each token costs pq_m B of list code, an 8-byte id and the
    standalone code (pq_m B and a list-number byte), not its 384 fp32 dimensions; with
    index.token_copy the lists alone, and 384 fp16 dimensions on disk."""
    arguments = ["plan", "--config", str(CONFIGS / "demo.yaml"), "--entities", "100000"]
    som = ["--set", "model.scorer.name=som", "--set", "negatives.cache.enabled=false"]
    compressed = ["--set", "index.kind=ivfpq", "--set", "index.nlist=256", "--set", "index.pq_m=16"]
    assert main([*arguments, *som, *compressed, "--json"]) == 0
    whole = json.loads(capsys.readouterr().out)["index"]["whole index"]
    assert main([*arguments, *som, "--json"]) == 0
    flat = json.loads(capsys.readouterr().out)["index"]["whole index"]
    tokens = flat // (384 * 4)
    assert whole == tokens * (16 + 8 + 16 + 1)
    copied = ["--set", "index.token_copy=true"]
    assert main([*arguments, *som, *compressed, *copied, "--json"]) == 0
    index = json.loads(capsys.readouterr().out)["index"]
    assert index["whole index"] == tokens * (16 + 8)  # the lists; no standalone codes
    assert index["vector copy"] == tokens * 384 * 2


def test_a_plaid_index_plans_its_codes_inverse_and_one_quantiser(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Sum-of-max over plaid at 65,536 centroids and pq_m 16: each token costs its 2-byte
    centroid id, 16 B of residual code, an 8-byte id and at most 8 B of the inverse; a holder
    keeps the version's quantiser once (384 fp32 dimensions and 272 B of HNSW links a
    centroid)."""
    arguments = ["plan", "--config", str(CONFIGS / "demo.yaml"), "--entities", "100000"]
    som = ["--set", "model.scorer.name=som", "--set", "negatives.cache.enabled=false"]
    assert main([*arguments, *som, "--json"]) == 0
    tokens = json.loads(capsys.readouterr().out)["index"]["whole index"] // (384 * 4)
    plaid = ["--set", "index.kind=plaid", "--set", "index.nlist=65536", "--set", "index.pq_m=16"]
    assert main([*arguments, *som, *plaid, "--json"]) == 0
    index = json.loads(capsys.readouterr().out)["index"]
    assert index["whole index"] == tokens * (2 + 16 + 8 + 8)
    assert index["plaid quantiser"] == 65536 * (384 * 4 + 272)


def test_aida_blink_fits_a_24_gb_gpu_by_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    """The recipe as shipped (bert-large towers, 8 x 64 candidates of 128 tokens, ZeRO-2 on 4
    GPUs) needs activation checkpointing and candidate chunks to fit; without them it does not."""
    arguments = ["plan", "--config", str(CONFIGS / "aida-blink.yaml"), "--entities", "5903530"]
    assert main([*arguments, "--json"]) == 0
    shipped = json.loads(capsys.readouterr().out)
    assert shipped["trainer_total"] < 20 * GIB  # leaves room for the CUDA context
    assert shipped["index"]["whole index"] == 5903530 * 1024 * 2
    plain = ["--set", "model.activation_checkpointing=false"]
    assert main([*arguments, *plain, "--set", "training.candidate_chunk_size=0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["trainer_total"] > 24 * GIB


def test_the_negative_cache_is_every_entitys_vectors_on_each_worker(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """aida-blink with the negative cache, in bfloat16 as it trains: 5.9M entities x 1024 dims x
    2 B and 9 B of step and flag a row on each worker, 11.3 GiB; the recipe still fits its 24 GB
    GPUs."""
    arguments = ["plan", "--config", str(CONFIGS / "aida-blink.yaml"), "--entities", "5903530"]
    cache = ["--set", "negatives.cache.enabled=true"]
    assert main([*arguments, "--json"]) == 0
    shipped = json.loads(capsys.readouterr().out)
    assert "negative cache" not in shipped["trainer"]
    assert main([*arguments, *cache, "--json"]) == 0
    cached = json.loads(capsys.readouterr().out)
    assert cached["trainer"]["negative cache"] == 5903530 * (1024 * 2 + 9)
    assert cached["trainer_total"] == shipped["trainer_total"] + 5903530 * (1024 * 2 + 9)
    assert cached["trainer_total"] < 20 * GIB


def test_plan_without_a_catalogue_asks_for_its_size(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--config", str(CONFIGS / "demo.yaml"), "--set", "data.root=nowhere"])
    assert code == 2
    assert "--entities" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("hidden_dropout_prob", -1, "dropout probability"),
        ("num_attention_heads", 7, "not a multiple of the number of attention heads"),
        ("max_position_embeddings", 10**30, "Overflow"),
    ],
)
def test_a_model_config_no_tower_can_be_built_from_is_one_error_naming_it(
    key: str, value: object, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A config that reads as JSON but describes no tower transformers can build (found by the
    boundary property test): exit 2 naming the model directory, not torch's traceback."""
    tokenizer = write_wordpiece_tokenizer(tmp_path, ["a", "b"])
    BertModel(tiny_bert_config(len(tokenizer))).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, key: value}))
    capsys.readouterr()
    assert main(["plan", "--set", f"model.path={tmp_path}", "--entities", "100"]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"hnce plan: {tmp_path}: AutoModel cannot load it: ") and said in error
