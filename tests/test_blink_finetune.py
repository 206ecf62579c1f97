"""hnce finetune-blink: fixture files in the real formats (KILT AIDA jsonl train / dev /
test_without_answers, BLINK entity.jsonl, a .t7 tensor of encodings) and a tiny BERT saved as a
BLINK checkpoint; index version 0 from the .t7, KILT predictions, missing golds, BLINK export."""

from __future__ import annotations

import json
from pathlib import Path

import faiss
import numpy as np
import pytest
import torch
from transformers import BertConfig, BertTokenizerFast

from cluster.index_store import IndexStore
from cluster.tables import MISSING_GOLD, EntityCatalogue, Mention
from encoders.biencoder import build_biencoder, load_biencoder
from encoders.blink import export_blink_biencoder, import_blink_biencoder
from encoders.scorers import ScorerConfig
from pipeline.blink_finetune.index_v0 import index_from_encodings, read_blink_encodings
from pipeline.blink_finetune.kilt_output import (
    linking_accuracy,
    read_kilt_inputs,
    write_kilt_predictions,
)
from pipeline.cli.main import main
from pipeline.data.bad_rows import BadRowError
from pipeline.data.kilt import convert_kilt
from pipeline.evaluate import encode_catalogue

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
CITIES = [
    ("paris", "france"),
    ("london", "england"),
    ("berlin", "germany"),
    ("rome", "italy"),
    ("madrid", "spain"),
    ("vienna", "austria"),
    ("prague", "czechia"),
    ("oslo", "norway"),
    ("lisbon", "portugal"),
    ("dublin", "ireland"),
]
MISSING = ("atlantis", 999)  # named by AIDA, absent from the catalogue
CONTEXTS = [("he flew to", "last week ."), ("the team from", "won again ."), ("we met in", ".")]
WORDS = ["is", "a", "city", "in", "the", "capital", "of", *[w for c in CONTEXTS for w in c]]


def curid(index: int) -> int:
    return 1000 + index


def aida_line(mention_id: str, title: str, wikipedia_id: int | None, context: int) -> dict:
    left, right = CONTEXTS[context % len(CONTEXTS)]
    line: dict = {
        "id": mention_id,
        "input": f"{left} [START_ENT] {title} [END_ENT] {right}",
        "meta": {"left_context": left, "mention": title, "right_context": right},
    }
    if wikipedia_id is not None:
        line["output"] = [
            {
                "answer": title.capitalize(),
                "provenance": [{"wikipedia_id": str(wikipedia_id), "title": title.capitalize()}],
            }
        ]
    return line


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """BLINK entity.jsonl, KILT AIDA train/dev/test_without_answers, a tiny BERT as a BLINK
    checkpoint, its base model directory and a .t7 of its own entity encodings."""
    root = tmp_path_factory.mktemp("blink-inputs")
    words = sorted(
        {w for text in WORDS for w in text.split()} | {c for pair in CITIES for c in pair}
    )
    words += [MISSING[0]]
    vocab = ["[PAD]", "[unused0]", "[unused1]", "[unused2]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab += [w for w in words if w not in vocab]
    base = root / "bert-base-dir"
    base.mkdir()
    (base / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tokenizer = BertTokenizerFast(vocab=str(base / "vocab.txt"))
    tokenizer.save_pretrained(base)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    config.save_pretrained(base)
    torch.manual_seed(0)
    model = build_biencoder(config, "dual", tokenizer=tokenizer, entity_length=24)
    export_blink_biencoder(model, root / "biencoder_tiny.bin")

    entities = [
        {
            "text": f"{city} is the capital city of {country} .",
            "idx": f"https://en.wikipedia.org/wiki?curid={curid(i)}",
            "title": city.capitalize(),
            "entity": city.capitalize(),
        }
        for i, (city, country) in enumerate(CITIES)
    ]
    write_jsonl(root / "entity.jsonl", entities)
    train = [
        aida_line(f"train-{n}", CITIES[n % len(CITIES)][0], curid(n % len(CITIES)), n)
        for n in range(20)
    ]
    train.append(aida_line("train-missing", MISSING[0], MISSING[1], 0))
    write_jsonl(root / "aidayago2-train-kilt.jsonl", train)
    dev = [aida_line(f"dev-{n}", CITIES[n][0], curid(n), n + 1) for n in range(5)]
    dev.append(aida_line("dev-missing", MISSING[0], MISSING[1], 2))
    write_jsonl(root / "aidayago2-dev-kilt.jsonl", dev)
    test = [aida_line(f"test-{n}", CITIES[n + 5][0], None, n) for n in range(4)]
    write_jsonl(root / "aidayago2-test_without_answers-kilt.jsonl", test)

    # BLINK's all_entities_large.t7 is its entity tower's [CLS] encodings, one row per line
    catalogue_dir = root / "catalogue"
    convert_kilt(catalogue_dir, [], blink_entities=root / "entity.jsonl")
    imported = import_blink_biencoder(root / "biencoder_tiny.bin", base, entity_length=24)
    with torch.inference_mode():
        vectors, _ = encode_catalogue(
            imported, EntityCatalogue.open(catalogue_dir), 8, progress=False
        )
    torch.save(torch.from_numpy(vectors), root / "all_entities_tiny.t7")
    return {
        "root": root,
        "base": base,
        "checkpoint": root / "biencoder_tiny.bin",
        "entities": root / "entity.jsonl",
        "encodings": root / "all_entities_tiny.t7",
        "train": root / "aidayago2-train-kilt.jsonl",
        "dev": root / "aidayago2-dev-kilt.jsonl",
        "test": root / "aidayago2-test_without_answers-kilt.jsonl",
        "catalogue": catalogue_dir,
    }


def test_kilt_inputs_read_every_line_and_mark_unlabelled(inputs: dict[str, Path]) -> None:
    test = read_kilt_inputs(inputs["test"])
    dev = read_kilt_inputs(inputs["dev"])
    assert [item.id for item in test] == [f"test-{n}" for n in range(4)]
    assert not any(item.labelled for item in test)
    assert all(item.labelled for item in dev)
    assert dev[0].mention == "paris" and dev[0].context_left == "the team from"


def test_kilt_input_without_span_names_file_and_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "bad-kilt.jsonl", [{"id": "a", "input": "no span"}])
    with pytest.raises(BadRowError, match=r"bad-kilt.jsonl:1: offsets_outside_context"):
        read_kilt_inputs(path)


def test_predictions_are_kilt_lines_one_per_input(inputs: dict[str, Path], tmp_path: Path) -> None:
    catalogue = EntityCatalogue.open(inputs["catalogue"])
    items = read_kilt_inputs(inputs["test"])
    target = tmp_path / "predictions.jsonl"
    write_kilt_predictions(target, items, np.array([5, 6, -1, 0]), catalogue)
    lines = [json.loads(line) for line in target.read_text().splitlines()]
    assert [line["id"] for line in lines] == [item.id for item in items]
    assert lines[0] == {
        "id": "test-0",
        "output": [
            {"answer": "Vienna", "provenance": [{"wikipedia_id": "1005", "title": "Vienna"}]}
        ],
    }
    assert lines[2]["output"] == []  # no candidate: an empty answer list, never a dropped line


def test_missing_gold_counts_as_error() -> None:
    mentions = [
        Mention("a", "", "x", "", 1, "", (1,)),
        Mention("b", "", "y", "", 2, "", (2, 3)),
        Mention("c", "", "z", "", MISSING_GOLD, "", (MISSING_GOLD,)),
        Mention("d", "", "w", "", 4, "", (4,)),
    ]
    found = {
        "a": np.array([1, 5]),
        "b": np.array([3, 2]),  # an alias gold at rank 1 is correct
        "c": np.array([-1, -1]),  # padding must never match the missing gold (-1)
        "d": np.array([5, 4]),
    }
    accuracy = linking_accuracy("dev", mentions, found)
    assert (accuracy.mentions, accuracy.missing_gold, accuracy.correct) == (4, 1, 2)
    assert accuracy.accuracy == pytest.approx(0.5)
    assert accuracy.accuracy_in_catalogue == pytest.approx(2 / 3)
    assert accuracy.recall_at_k == pytest.approx(0.75)


def test_index_version_zero_holds_the_t7_rows(inputs: dict[str, Path], tmp_path: Path) -> None:
    model = import_blink_biencoder(inputs["checkpoint"], inputs["base"], entity_length=24)
    catalogue = EntityCatalogue.open(inputs["catalogue"])
    store = IndexStore(tmp_path / "index")
    from cluster.sharded_index import IndexSpec

    version = index_from_encodings(
        store, inputs["encodings"], model, tmp_path / "export", len(catalogue), IndexSpec(), 4
    )
    assert version.version == 0 and store.current_version() == 0
    manifest = version.manifest
    assert manifest["checkpoint"] == 0 and manifest["num_entities"] == len(catalogue)
    assert [s["count"] for s in manifest["shards"]] == [4, 4, 2]
    encodings = read_blink_encodings(inputs["encodings"])
    stored = np.concatenate(
        [s.index.reconstruct_n(0, s.index.ntotal) for s in version.searcher.shards]
    )
    ids = np.concatenate([s.ids for s in version.searcher.shards])
    np.testing.assert_array_equal(stored, encodings.numpy()[ids])
    assert isinstance(version.searcher.shards[0].index, faiss.IndexFlatIP)


def test_t7_must_match_catalogue_and_scorer(inputs: dict[str, Path], tmp_path: Path) -> None:
    from cluster.sharded_index import IndexSpec

    model = import_blink_biencoder(inputs["checkpoint"], inputs["base"], entity_length=24)
    with pytest.raises(ValueError, match="10 encodings but the catalogue has 11"):
        index_from_encodings(
            IndexStore(tmp_path / "a"), inputs["encodings"], model, tmp_path, 11, IndexSpec()
        )
    multi = import_blink_biencoder(
        inputs["checkpoint"], inputs["base"], scorer=ScorerConfig(name="multi", m=2)
    )
    with pytest.raises(ValueError, match="one vector per entity"):
        index_from_encodings(
            IndexStore(tmp_path / "b"), inputs["encodings"], multi, tmp_path, 10, IndexSpec()
        )


@pytest.mark.slow
def test_finetune_blink_end_to_end(inputs: dict[str, Path], tmp_path: Path) -> None:
    run_dir, data_dir = tmp_path / "run", tmp_path / "data"
    code = main(
        [
            "finetune-blink",
            "--config",
            str(CONFIGS / "aida-blink-test.yaml"),
            "--set",
            f"run.dir={run_dir}",
            "--set",
            f"data.root={data_dir}",
            "--set",
            "index.keep_versions=5",
            "--blink-checkpoint",
            str(inputs["checkpoint"]),
            "--base-model",
            str(inputs["base"]),
            "--entities",
            str(inputs["entities"]),
            "--encodings",
            str(inputs["encodings"]),
            "--aida",
            str(inputs["train"]),
            str(inputs["dev"]),
            str(inputs["test"]),
            "--set",
            "blink.index_shard_size=4",
            "--no-progress",
        ]
    )
    assert code == 0
    report = json.loads((run_dir / "finetune_report.json").read_text())

    # the converter skipped (and counted) the train mention whose gold is not in the catalogue
    assert report["data"]["train_rejected"] == 1 and report["data"]["mentions"]["train"] == 20
    # version 0 is BLINK's own encodings, published as a proper version with a manifest
    store = IndexStore(run_dir / "index")
    zero = store.open(0)
    assert zero.manifest["checkpoint"] == 0 and zero.num_entities == 10
    # the final model is evaluated through an index of every catalogue entity
    final = store.current()
    assert final is not None and final.checkpoint == report["final_step"] == 6
    assert final.num_entities == 10 and final.searcher.ntotal == 10

    splits = {s["file"]: s for s in report["splits"]}
    dev = splits["aidayago2-dev-kilt.jsonl"]
    for figures in (dev["before"], dev["after"]):
        assert figures["mentions"] == 6 and figures["missing_gold"] == 1
        assert figures["accuracy"] == pytest.approx(figures["correct"] / 6)
        assert figures["correct"] <= 5
    assert splits["aidayago2-test_without_answers-kilt.jsonl"]["after"] is None

    for name, source in (
        ("aidayago2-dev-kilt.jsonl", inputs["dev"]),
        ("aidayago2-test_without_answers-kilt.jsonl", inputs["test"]),
        ("aidayago2-train-kilt.jsonl", inputs["train"]),
    ):
        lines = [json.loads(x) for x in (run_dir / "predictions" / name).read_text().splitlines()]
        assert [x["id"] for x in lines] == [
            json.loads(x)["id"] for x in source.read_text().splitlines()
        ]
        for line in lines:
            (output,) = line["output"]
            (provenance,) = output["provenance"]
            assert set(provenance) == {"wikipedia_id", "title"}
            assert int(provenance["wikipedia_id"]) in {curid(i) for i in range(len(CITIES))}
            assert output["answer"] == provenance["title"]

    # the BLINK export loads back with outputs identical to the Hugging Face export
    hf = load_biencoder(run_dir / "export" / "hf")
    blink = import_blink_biencoder(
        run_dir / "export" / "biencoder_blink.bin", inputs["base"], entity_length=24
    )
    tokens = hf.tokenize_entities(["Paris", "Oslo"], ["paris is a city", "oslo is a city"])
    mentions = hf.tokenize_mentions(["he flew to"], ["rome"], ["."])
    with torch.inference_mode():
        for a, b in (
            (hf.encode_entities(**tokens)[0], blink.encode_entities(**tokens)[0]),
            (hf.encode_mentions(**mentions)[0], blink.encode_mentions(**mentions)[0]),
        ):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    # and it differs from the starting checkpoint: it was trained
    start = import_blink_biencoder(inputs["checkpoint"], inputs["base"], entity_length=24)
    with torch.inference_mode():
        assert not torch.equal(start.encode_entities(**tokens)[0], hf.encode_entities(**tokens)[0])


def test_index_version_zero_encoded_from_the_checkpoint_and_mined(
    inputs: dict[str, Path], tmp_path: Path
) -> None:
    """Without BLINK's encodings, version 0 is the checkpoint's own encodings; the train
    mentions are mined against it into negatives version 0 (checkpoint step 0)."""
    from cluster.negatives_store import NegativesStore
    from cluster.sharded_index import IndexSpec
    from pipeline.blink_finetune.index_v0 import index_from_model, mine_initial_negatives
    from pipeline.rerank import retrieve_candidates

    model = import_blink_biencoder(inputs["checkpoint"], inputs["base"], entity_length=24)
    catalogue = EntityCatalogue.open(inputs["catalogue"])
    version = index_from_model(
        IndexStore(tmp_path / "index"), model, tmp_path, catalogue, IndexSpec(), shard_size=3
    )
    assert version.version == 0 and len(version.manifest["shards"]) == 4
    stored = np.concatenate(
        [s.index.reconstruct_n(0, s.index.ntotal) for s in version.searcher.shards]
    )
    np.testing.assert_allclose(
        stored, read_blink_encodings(inputs["encodings"]).numpy(), rtol=1e-5, atol=1e-5
    )
    mentions = [
        Mention(f"m{i}", "we met in", CITIES[i][0], ".", i, "", (i,)) for i in range(len(CITIES))
    ]
    store = NegativesStore(tmp_path / "negatives")
    mine_initial_negatives(store, version, model, "train", mentions, top_n=5)
    negatives = store.latest("train")
    assert negatives is not None and negatives.version == 0 and negatives.checkpoint_step == 0
    # the same candidates as searching an exact index encoded now (hnce rerank --retriever)
    exact = retrieve_candidates(model, mentions, 5, catalogue=catalogue, progress=False)
    cands, _ = negatives.lookup([m.mention_id for m in mentions])
    np.testing.assert_array_equal(cands.numpy(), exact.cands)
