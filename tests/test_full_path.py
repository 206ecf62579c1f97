"""The whole path of `benchmarks/full_scale.py` at CI size, through the real `hnce` commands:
generate KILT-format inputs → `hnce data kilt` → `hnce refresh --initial` (index and negatives
v0) → `hnce train` on them → `hnce refresh` (the final checkpoint) → `hnce eval` →
`hnce eval --kilt-predictions`,
then the invariants that must hold at any scale:

- every published index version holds every entity exactly once;
- the mined candidates of a negatives version equal an exact search (all mention vectors
  against all of that version's entity vectors);
- the token store equals a fresh tokenization of the catalogue;
- evaluation through the refresh's published index equals evaluation by re-encoding.

Size: 10,000 entities at entity length 32 (AIDA's mention files scaled to 600 / 150 / 150), in
8 shards of 1,250 so that shard ranges, merging and mining across shards are exercised. The
invariants hold at any size, so they are checked at the smallest that exercises them
(at 200,000 the module took ~13 minutes of the suite, at 20,000 ~4); the figures at scale (throughput, memory,
recall at 200,000 and 5.9M) are `benchmarks/full_scale.py`'s and `benchmarks/token_index.py`'s.
The pages are stubs (`--lead-median-chars 150`: a 32-token window holds
~160 characters), which halves the bytes that generation, conversion and tokenization go through.
Four passes over the catalogue (the token store, index v0, the final refresh, the re-encoding
below) grow with it; the rest is the fixed start-up of each command's processes (Ray Train,
DeepSpeed, the encoder actors; the commands share one Ray instance). Training runs without its
asynchronous refresh: at this size a refresh does not land within the test's 20 steps and would
only take the trainer's second core (`tests/test_pipeline_train.py` checks that refreshes land
and are used). `benchmarks/full_scale.py` runs the same path, with the refresh, at entity length
128 over 200,000 and 5,903,530.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from exact_scores import max_over_vectors, recall, sum_of_max
from training_helpers import assert_exact_top_k
from transformers import AutoTokenizer, BertConfig, BertModel

from hnce.cluster.compute.entity_encoding import encode_entities
from hnce.cluster.compute.index_build import IndexedModel, ensure_token_store
from hnce.cluster.compute.retrieval import retrieve
from hnce.cluster.stores.checkpoints import EXPORT_DIR
from hnce.cluster.stores.index_store import IndexStore
from hnce.cluster.stores.negatives_store import NegativesVersion
from hnce.cluster.stores.tables import Mention, mention_split_path
from hnce.cluster.stores.tables_read import EntityCatalogue, MentionSplit
from hnce.cluster.stores.tokens import TOKENS_DIR, TokenStore
from hnce.cluster.stores.versioned_dir import version_dir_name
from hnce.encoders.biencoder import BiEncoder, load_biencoder, minilm_path
from hnce.encoders.formatting import register_markers, tokenize_entities
from hnce.pipeline.cli.main import main as hnce
from hnce.pipeline.config import load_config
from hnce.pipeline.data.kilt_synthetic import KNOWLEDGE_SOURCE, aida_file_name
from hnce.pipeline.recipe_models import untrained_export
from hnce.pipeline.run import refresh_plan

ENTITIES = 10_000
MENTIONS = {"train": 600, "dev": 150, "test": 150}
ENTITY_LENGTH = 32
SHARD_SIZE = 1_250
TOP_N = 16


def write_model(directory: Path) -> Path:
    """A 2-layer, 32-wide random BERT with the packaged MiniLM's vocabulary, its weights drawn
    with σ = 0.5: at BERT's 0.02 every entity's [CLS] vector is nearly the same (the 1st and
    16th best scores differ by ~1e-5), so a search over half the catalogue would pass for an
    exact one; at 0.5 they differ by ~2."""
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=1,
        intermediate_size=128,
        initializer_range=0.5,
    )
    torch.manual_seed(0)
    BertModel(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def write_recipe(root: Path) -> Path:
    recipe = {
        "run": {"dir": str(root / "run"), "seed": 0},
        "data": {"root": str(root / "data"), "train_split": "train", "eval_split": "test"},
        "model": {
            "path": str(write_model(root / "model")),
            "mention_length": 32,
            "entity_length": ENTITY_LENGTH,
        },
        "negatives": {"sampler": "mixed", "num_negatives": 7, "source": "index"},
        "training": {
            "steps": 20,
            "batch_size": 8,
            "learning_rate": 1.0e-3,
            "warmup_steps": 5,
            "num_workers": 1,
            "cpus_per_worker": 1,
            "checkpoint_every": 10,
            "negatives_check_every": 2,
            "keep_checkpoints": 10,
            "max_failures": 0,
            "log_every": 10,
        },
        "refresh": {
            "num_encoders": 1,
            "encoder_cpus": 1,
            "encoder_batch_size": 256,
            "shard_size": SHARD_SIZE,
            "top_n": TOP_N,
        },
        "index": {"kind": "flat", "keep_versions": 10},
        "cluster": {"address": "local"},
        "eval": {"ks": [1, 64, 100]},
    }
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def command(*arguments: str) -> None:
    """One `hnce` command in this process, on the session's Ray instance."""
    assert hnce([*arguments]) == 0, arguments


@pytest.fixture(scope="module")
def full_path(tmp_path_factory: pytest.TempPathFactory, ray_session: str) -> Path:
    """The path run once; the tests below check what it left."""
    return run_full_path(tmp_path_factory.mktemp("full-path"))


def run_full_path(root: Path) -> Path:
    raw = root / "raw"
    counts = [f"--{split}={count}" for split, count in MENTIONS.items()]
    command(
        "data",
        "synthetic-kilt",
        *("--out", str(raw), "--pages", str(ENTITIES), *counts),
        *("--lead-median-chars", "150", "--workers", "2", "--part-lines", str(ENTITIES // 4)),
    )
    aida = [str(raw / aida_file_name(split)) for split in MENTIONS]
    command(
        "data",
        "kilt",
        "--knowledge-source",
        str(raw / KNOWLEDGE_SOURCE),
        "--aida",
        *aida,
        "--out",
        str(root / "data"),
    )
    recipe = str(write_recipe(root))
    command("refresh", "--config", recipe, "--initial", "--set", "refresh.num_encoders=2")
    no_refresh = ("--set", "refresh.enabled=false", "--set", "negatives.initial=model")
    command("train", "--config", recipe, "--no-progress", *no_refresh)  # on v0, built above
    command("refresh", "--config", recipe)  # the checkpoint training ended on
    command("eval", "--config", recipe, "--no-progress", "--out", str(root / "eval.json"))
    command("eval", "--config", recipe, "--no-progress", "--kilt-predictions", aida[2])
    return root


def config_of(root: Path, run_dir: Path | None = None):
    overrides = [] if run_dir is None else [f"run.dir={run_dir}"]
    return load_config(root / "recipe.yaml", overrides)


@pytest.mark.slow
def test_every_index_version_holds_every_entity_once(full_path: Path) -> None:
    store = IndexStore(full_path / "run" / "index")
    versions = store.versions()
    assert 0 in versions and len(versions) >= 2  # v0 and at least the final checkpoint's
    for number in versions:
        searcher = store.open(number).load()
        ids = np.concatenate([shard.ids for shard in searcher.shards])
        np.testing.assert_array_equal(np.sort(ids), np.arange(ENTITIES))
        assert len(searcher.shards) == ENTITIES // SHARD_SIZE


def mention_queries(model: BiEncoder, mentions: list[Mention]) -> np.ndarray:
    """The query vectors [M, Q, d] of `mentions` under `model` (Q = 1 but for sum-of-max)."""
    with torch.inference_mode():
        tokens = model.tokenize_mentions(
            [m.context_left for m in mentions],
            [m.mention for m in mentions],
            [m.context_right for m in mentions],
        )
        return model.mention_query_vectors(**tokens).numpy()


@pytest.mark.slow
def test_mined_candidates_equal_an_exact_search(full_path: Path) -> None:
    """Every negatives version's top-N of every train mention are the N best entities of all,
    scored with that version's own entity vectors and the version's checkpoint's mention tower."""
    run = full_path / "run"
    mentions = MentionSplit.open(mention_split_path(full_path / "data", "train")).read_all()
    mined_versions = [path.name for path in (run / "negatives").iterdir() if path.is_dir()]
    checked = 0
    for number in IndexStore(run / "index").versions():
        if version_dir_name(number) not in mined_versions:
            continue  # retention removed this negatives version
        checked += 1
        version = IndexStore(run / "index").open(number)
        searcher = version.load()
        vectors = np.zeros((ENTITIES, searcher.shards[0].vectors.shape[1]), np.float32)
        for shard in searcher.shards:
            vectors[shard.ids] = shard.vectors
        model = load_biencoder(Path(version.manifest.checkpoint_path))
        queries = mention_queries(model, mentions)[:, 0]
        negatives = NegativesVersion(run / "negatives" / version_dir_name(number) / "train.parquet")
        cands, _ = negatives.lookup([m.mention_id for m in mentions])
        for rows in np.array_split(np.arange(len(mentions)), len(mentions) // 100):
            assert_exact_top_k(cands[rows].numpy(), queries[rows] @ vectors.T)
    assert checked >= 2


@pytest.mark.slow
def test_token_store_matches_a_fresh_tokenization(full_path: Path) -> None:
    """Every row (so every edge of the store's build batches) against a fresh tokenization."""
    data = full_path / "data"
    (directory,) = [path for path in (data / TOKENS_DIR).iterdir() if path.is_dir()]
    store = TokenStore.open(directory)
    np.testing.assert_array_equal(store.entity_ids, np.arange(ENTITIES))
    tokenizer = AutoTokenizer.from_pretrained(full_path / "model")
    register_markers(tokenizer)
    catalogue = EntityCatalogue.open(data)
    fresh = tokenize_entities(
        tokenizer,
        catalogue.titles().to_pylist(),
        catalogue.texts().to_pylist(),
        ENTITY_LENGTH,
        pad_to_max_length=True,
    )
    np.testing.assert_array_equal(store.ids, fresh["input_ids"].numpy())
    np.testing.assert_array_equal(store.lengths, fresh["attention_mask"].sum(dim=1).numpy())


@pytest.mark.slow
def test_evaluation_through_the_published_index_equals_re_encoding(
    full_path: Path, tmp_path: Path, ray_session: str
) -> None:
    """The checkpoint the refresh last indexed, evaluated with the refresh's own version (no
    encoding) and again in a run directory that has no version of it (re-encoded)."""
    run = full_path / "run"
    published = IndexStore(run / "index").current()
    assert published is not None and published.checkpoint > 0
    checkpoint = run / "checkpoints" / f"step-{published.checkpoint}"
    model = IndexedModel.from_checkpoint(checkpoint, published.checkpoint)
    mentions = MentionSplit.open(mention_split_path(full_path / "data", "test")).read_all()
    config = config_of(full_path)
    fresh = config_of(full_path, tmp_path / "fresh-run")
    reused = retrieve(refresh_plan(config), model, mentions, 100)
    encoded = retrieve(refresh_plan(fresh), model, mentions, 100)
    assert not reused.built and reused.index_version.path == published.path
    assert encoded.built and encoded.index_version.path.is_relative_to(tmp_path)
    np.testing.assert_array_equal(reused.cands, encoded.cands)
    np.testing.assert_allclose(reused.scores, encoded.scores, rtol=0, atol=1e-5)
    # and what `hnce eval` reported (newest checkpoint) came from a full search: R@100 >= R@1
    report = json.loads((full_path / "eval.json").read_text())[0]
    assert report["num_entities"] == ENTITIES and report["num_mentions"] == MENTIONS["test"]
    predictions = run / "predictions" / aida_file_name("test")
    lines = [json.loads(line) for line in predictions.read_text().splitlines()]
    assert len(lines) == MENTIONS["test"] and all(line["output"] for line in lines)
    assert (checkpoint / EXPORT_DIR).is_dir()


#: each scorer's recipe settings, and the floor of its recall of the exact top-100 (measured at
#: 10,000 entities: sum-of-max 0.837 at depth 320, multi-8 0.996; at 200,000
#: `benchmarks/token_index.py --model tiny` measures them)
COMPRESSED = {
    "som": (["model.scorer.name=som", "index.token_copy=true"], 0.80),
    "multi-8": (["model.scorer.name=multi", "model.scorer.m=8"], 0.95),
}


@pytest.mark.slow
@pytest.mark.parametrize("scorer", COMPRESSED)
def test_compressed_multi_vector_search_keeps_the_exact_top_100(
    full_path: Path, tmp_path: Path, ray_session: str, scorer: str
) -> None:
    """Issue 26 at 10,000 entities: the untrained model's catalogue indexed by the encoder
    actors as ``hnce eval`` indexes a model, into a compressed index (IVF-PQ: one quantiser of
    1,024 lists for the catalogue, 16 one-byte codes a vector; sum-of-max over every entity
    token, ~320,000 of them, with a float16 copy of the tokens on disk; multi-8 over its 80,000
    entity vectors, with its copy), and searched as evaluation, mining and ``hnce link`` search
    (by the shard holders: candidates from the IVF-PQ lists, each rescored exactly from the copy,
    merged across the 8 shards), against the exact top-100 over every entity's float32 vectors
    encoded here. The catalogue still spans every one of the 1,024 lists and 8 shards; the
    candidate depth (320 across a holder's shards) is the one this test used at 200,000 (6,400)
    scaled with the catalogue, so the candidates are the same 3 % of it. Sum-of-max probes 32
    lists a query token; multi-8 probes 512 lists for a mention's one vector. At 200,000
    (``benchmarks/token_index.py --model tiny``) sum-of-max kept 0.976 at depth 6,400 and multi-8
    0.992; without the rescoring recall falls far below the floors (measured there with it
    disabled: multi-8 ranked by its IVF-PQ scores kept 0.505, sum-of-max ranked by its
    candidates' IVF-PQ hit scores, Σ_i of each query token's best hit, 0.318)."""
    settings, floor = COMPRESSED[scorer]
    run_dir = tmp_path / "run"
    settings = [
        *settings,
        f"run.dir={run_dir}",
        "index.kind=ivfpq",
        "index.nlist=1024",
        "index.pq_m=16",
        "index.candidate_depth=320",
    ]
    config = load_config(full_path / "recipe.yaml", settings)
    model = IndexedModel.from_export(untrained_export(config))
    mentions = MentionSplit.open(mention_split_path(full_path / "data", "test")).read_all()[:40]
    searched = retrieve(refresh_plan(config), model, mentions, 100)
    assert searched.built and searched.index_version.manifest.index["kind"] == "ivfpq"

    encoder = load_biencoder(model.export_dir)
    tokens = ensure_token_store(full_path / "data", model)
    with torch.inference_mode():
        vectors, ids, _ = encode_entities(encoder, tokens, np.arange(ENTITIES), 256)
    queries = mention_queries(encoder, mentions)
    if scorer == "som":
        exact_scores = sum_of_max(queries, vectors, ids)
    else:
        exact_scores = max_over_vectors(queries[:, 0], vectors, ids)
    exact = np.argsort(-exact_scores, axis=1)[:, :100]
    assert recall(searched.cands, exact) >= floor, recall(searched.cands, exact)
