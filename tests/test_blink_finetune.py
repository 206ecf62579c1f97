"""hnce finetune-blink: fixture files in the real formats (KILT AIDA jsonl train / dev /
test_without_answers, BLINK entity.jsonl, a .t7 tensor of encodings) and the packaged MiniLM
saved as a BLINK checkpoint; index version 0 from the .t7 or encoded, KILT predictions, missing
golds, BLINK export, and linking that fine-tuning improves.

The catalogue names each city's entity by its country ("Capital of France": the capital city of
france), and AIDA mentions name the city ("paris"): the starting model links most of them from
what it knows, and fine-tuning on the train split (every city, other contexts) must link all."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import write_jsonl

from hnce.cluster.compute.entity_encoding import read_encodings
from hnce.cluster.compute.index_build import IndexedModel
from hnce.cluster.compute.refresh.initial import check_encodings, initial_from_model
from hnce.cluster.compute.refresh.plan import RefreshPlan
from hnce.cluster.compute.refresh.settings import RefreshSettings
from hnce.cluster.stores.checkpoints import EXPORT_DIR, checkpoint_dir
from hnce.cluster.stores.index_spec import IndexSpec
from hnce.cluster.stores.index_store import IndexStore
from hnce.cluster.stores.negatives_store import NegativesStore
from hnce.cluster.stores.tables import MISSING_GOLD, Entity, Mention
from hnce.cluster.stores.tables_read import EntityCatalogue
from hnce.cluster.stores.tables_write import write_dataset
from hnce.encoders.biencoder import build_biencoder, export_biencoder, load_biencoder, minilm_path
from hnce.encoders.blink_checkpoint import export_blink_biencoder, import_blink_biencoder
from hnce.encoders.scorers import ScorerConfig
from hnce.errors import InputError
from hnce.pipeline.cli.main import main
from hnce.pipeline.data.bad_rows import BadRowError
from hnce.pipeline.data.kilt import convert_kilt
from hnce.pipeline.data.kilt_predictions import (
    linking_accuracy,
    read_kilt_inputs,
    write_kilt_predictions,
)

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


def curid(index: int) -> int:
    return 1000 + index


def gold(index: int) -> tuple[int, str]:
    """(wikipedia_id, title) of CITIES[index]'s entity."""
    return curid(index), f"Capital of {CITIES[index][1].capitalize()}"


def aida_line(
    mention_id: str, mention: str, context: int, answer: tuple[int, str] | None = None
) -> dict:
    """A KILT AIDA line; `answer` (wikipedia_id, title) labels it."""
    left, right = CONTEXTS[context % len(CONTEXTS)]
    line: dict = {
        "id": mention_id,
        "input": f"{left} [START_ENT] {mention} [END_ENT] {right}",
        "meta": {"left_context": left, "mention": mention, "right_context": right},
    }
    if answer is not None:
        provenance = [{"wikipedia_id": str(answer[0]), "title": answer[1]}]
        line["output"] = [{"answer": answer[1], "provenance": provenance}]
    return line


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """BLINK entity.jsonl, KILT AIDA train/dev/test_without_answers, MiniLM as a BLINK
    checkpoint, its base model directory and a .t7 of its own entity encodings."""
    root = tmp_path_factory.mktemp("blink-inputs")
    base = minilm_path()
    model = build_biencoder(base, "dual", mention_length=24, entity_length=24, pooling="cls")
    export_blink_biencoder(model, root / "biencoder_minilm.bin")
    entities = [
        {
            "text": f"the capital city of {country} .",
            "idx": f"https://en.wikipedia.org/wiki?curid={curid(i)}",
            "title": gold(i)[1],
            "entity": gold(i)[1],
        }
        for i, (_, country) in enumerate(CITIES)
    ]
    write_jsonl(root / "entity.jsonl", entities)
    atlantis = (MISSING[1], "Atlantis")
    train = [aida_line(f"train-{n}", CITIES[n % 10][0], n, gold(n % 10)) for n in range(20)]
    train.append(aida_line("train-missing", MISSING[0], 0, atlantis))
    write_jsonl(root / "aidayago2-train-kilt.jsonl", train)
    dev = [aida_line(f"dev-{n}", CITIES[n][0], n + 1, gold(n)) for n in range(10)]
    dev.append(aida_line("dev-missing", MISSING[0], 2, atlantis))
    write_jsonl(root / "aidayago2-dev-kilt.jsonl", dev)
    test = [aida_line(f"test-{n}", CITIES[n + 5][0], n) for n in range(4)]
    write_jsonl(root / "aidayago2-test_without_answers-kilt.jsonl", test)

    # BLINK's all_entities_large.t7 is its entity tower's [CLS] encodings, one row per line
    catalogue_dir = root / "catalogue"
    convert_kilt(catalogue_dir, [], blink_entities=root / "entity.jsonl")
    imported = import_blink_biencoder(
        root / "biencoder_minilm.bin", base, mention_length=24, entity_length=24
    )
    catalogue = EntityCatalogue.open(catalogue_dir)
    with torch.inference_mode():
        tokens = imported.tokenize_entities(
            catalogue.titles().to_pylist(), catalogue.texts().to_pylist()
        )
        vectors, _ = imported.entity_index_vectors(tokens["input_ids"], tokens["attention_mask"])
    torch.save(vectors.contiguous(), root / "all_entities_minilm.t7")
    export_biencoder(imported, root / "imported-export")
    return {
        "root": root,
        "base": base,
        "checkpoint": root / "biencoder_minilm.bin",
        "entities": root / "entity.jsonl",
        "encodings": root / "all_entities_minilm.t7",
        "train": root / "aidayago2-train-kilt.jsonl",
        "dev": root / "aidayago2-dev-kilt.jsonl",
        "test": root / "aidayago2-test_without_answers-kilt.jsonl",
        "catalogue": catalogue_dir,
        "export": root / "imported-export",
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
            {
                "answer": "Capital of Austria",
                "provenance": [{"wikipedia_id": "1005", "title": "Capital of Austria"}],
            }
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


def test_t7_encodings_must_match_the_catalogue_size_and_a_one_vector_scorer(
    inputs: dict[str, Path], tmp_path: Path
) -> None:
    model = IndexedModel.from_export(inputs["export"])
    check_encodings(inputs["encodings"], model, 10)
    with pytest.raises(InputError, match="10 encodings but the catalogue has 11"):
        check_encodings(inputs["encodings"], model, 11)
    multi = import_blink_biencoder(
        inputs["checkpoint"], inputs["base"], scorer=ScorerConfig(name="multi", m=2)
    )
    export_biencoder(multi, tmp_path / "multi")
    with pytest.raises(InputError, match="one vector per entity"):
        check_encodings(inputs["encodings"], IndexedModel.from_export(tmp_path / "multi"), 10)


def _finetune_arguments(inputs: dict[str, Path], run_dir: Path, data_dir: Path) -> list[str]:
    """``hnce finetune-blink`` on the fixture files, with the test recipe."""
    return [
        "finetune-blink",
        "--config",
        str(CONFIGS / "aida-blink-test.yaml"),
        "--set",
        f"run.dir={run_dir}",
        "--set",
        f"data.root={data_dir}",
        "--set",
        "index.keep_versions=5",
        "--set",
        "training.learning_rate=1.0e-4",
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
        "refresh.shard_size=4",
        "--no-progress",
    ]


@pytest.fixture(scope="module")
def finetuned(
    inputs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, ray_session: str
) -> tuple[Path, dict]:
    """One ``hnce finetune-blink`` run end to end, shared by the tests below: its run directory
    and its ``finetune_report.json``."""
    root = tmp_path_factory.mktemp("finetune")
    run_dir, data_dir = root / "run", root / "data"
    code = main(_finetune_arguments(inputs, run_dir, data_dir))
    assert code == 0
    return run_dir, json.loads((run_dir / "finetune_report.json").read_text())


@pytest.mark.slow
def test_finetune_blink_skips_a_missing_gold_and_publishes_blinks_encodings_as_version_zero(
    inputs: dict[str, Path], finetuned: tuple[Path, dict]
) -> None:
    run_dir, report = finetuned
    # the converter skipped (and counted) the train mention whose gold is not in the catalogue
    assert report["data"]["train_rejected"] == 1 and report["data"]["mentions"]["train"] == 20
    # version 0 is BLINK's own encodings, published as a proper version with a manifest
    zero = IndexStore(run_dir / "index").open(0)
    assert zero.checkpoint == 0 and zero.num_entities == 10
    assert zero.manifest.source == f"encodings {inputs['encodings']}"


@pytest.mark.slow
def test_finetune_blink_evaluates_the_final_model_through_its_own_index(
    finetuned: tuple[Path, dict],
) -> None:
    run_dir, report = finetuned
    # the final model is evaluated through an index of that model over every catalogue entity
    (searched,) = {split["index"] for split in report["splits"]}
    final = IndexStore(Path(searched).parent).open(int(Path(searched).name[1:]))
    final_export = checkpoint_dir(run_dir, report["final_step"]) / EXPORT_DIR
    assert final.manifest.model == IndexedModel.from_export(final_export).fingerprint
    assert final.num_entities == 10 and final.num_vectors == 10


@pytest.mark.slow
def test_finetune_blink_links_every_dev_mention_whose_gold_is_in_the_catalogue(
    finetuned: tuple[Path, dict],
) -> None:
    _, report = finetuned
    splits = {s["file"]: s for s in report["splits"]}
    dev = splits["aidayago2-dev-kilt.jsonl"]
    for figures in (dev["before"], dev["after"]):
        assert figures["mentions"] == 11 and figures["missing_gold"] == 1
    # fine-tuning links better: every dev mention whose gold is in the catalogue, unlike before
    assert dev["after"]["correct"] == 10 > dev["before"]["correct"], (dev["before"], dev["after"])
    assert splits["aidayago2-test_without_answers-kilt.jsonl"]["after"] is None


@pytest.mark.slow
def test_finetune_blink_predicts_one_kilt_line_per_input_line_of_every_split(
    inputs: dict[str, Path], finetuned: tuple[Path, dict]
) -> None:
    run_dir, _ = finetuned
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


@pytest.mark.slow
def test_finetune_blinks_export_equals_its_hugging_face_export_and_was_trained(
    inputs: dict[str, Path], finetuned: tuple[Path, dict]
) -> None:
    run_dir, _ = finetuned
    # the BLINK export loads back with outputs identical to the Hugging Face export
    hf = load_biencoder(run_dir / "export" / "hf")
    blink = import_blink_biencoder(
        run_dir / "export" / "biencoder_blink.bin",
        inputs["base"],
        mention_length=24,
        entity_length=24,
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
    start = import_blink_biencoder(
        inputs["checkpoint"], inputs["base"], mention_length=24, entity_length=24
    )
    with torch.inference_mode():
        assert not torch.equal(start.encode_entities(**tokens)[0], hf.encode_entities(**tokens)[0])


def _version_zero_plan(inputs: dict[str, Path], root: Path) -> RefreshPlan:
    """The BLINK catalogue with train mentions of each city, and a refresh plan over them."""
    data = root / "data"
    catalogue = EntityCatalogue.open(inputs["catalogue"])
    entities = [
        Entity(i, key, title, text)
        for i, (key, title, text) in enumerate(
            zip(
                catalogue.keys().to_pylist(),
                catalogue.titles().to_pylist(),
                catalogue.texts().to_pylist(),
                strict=True,
            )
        )
    ]
    train = [
        Mention(f"m{i}", "we met in", city, ".", i, "", (i,)) for i, (city, _) in enumerate(CITIES)
    ]
    write_dataset(data, entities, {"train": train})
    refresh = RefreshSettings(shard_size=3, top_n=5, num_encoders=2)
    return RefreshPlan(root / "run", data, refresh, IndexSpec(faiss_device="cpu"))


def _stored_vectors(plan: RefreshPlan) -> np.ndarray:
    version = plan.index_store.open(0)
    searcher = version.load()
    return np.concatenate([shard.vectors for shard in searcher.shards])


@pytest.mark.slow
@pytest.mark.parametrize("from_t7", [True, False], ids=["t7-encodings", "encoded"])
def test_index_version_zero_holds_the_models_vectors_and_is_mined(
    inputs: dict[str, Path], tmp_path: Path, ray_session: str, from_t7: bool
) -> None:
    """Version 0 is the .t7's rows as they are (here BLINK's encodings scaled by 2, so they differ
    from what the model would encode), or the checkpoint's own encodings (equal up to float
    error); the train mentions are mined against it into negatives version 0."""
    plan = _version_zero_plan(inputs, tmp_path)
    model = IndexedModel.from_export(inputs["export"])
    expected = read_encodings(inputs["encodings"]).numpy()
    encodings = None
    if from_t7:
        expected = expected * 2
        encodings = tmp_path / "scaled.t7"
        torch.save(torch.from_numpy(expected), encodings)
    prepared = initial_from_model(plan, model, "train", encodings)
    assert prepared is not None and prepared.encoded != from_t7  # a .t7 is read, not encoded
    version = prepared.index
    assert version.version == 0 and plan.index_store.current_version() == 0
    assert version.checkpoint == 0 and version.num_entities == 10
    assert [shard.count for shard in version.manifest.shards] == [3, 3, 3, 1]
    if from_t7:
        np.testing.assert_array_equal(_stored_vectors(plan), expected)
    else:
        np.testing.assert_allclose(_stored_vectors(plan), expected, rtol=1e-5, atol=1e-5)
    negatives = NegativesStore(plan.run_dir / "negatives").latest("train")
    assert negatives.version == 0 and negatives.checkpoint_step == 0
    # the exact top-5 of each mention: scores straight from the model, no index
    imported = load_biencoder(inputs["export"])
    with torch.inference_mode():
        mentions = imported.tokenize_mentions(
            ["we met in"] * 10, [c for c, _ in CITIES], ["."] * 10
        )
        queries = imported.mention_query_vectors(mentions["input_ids"], mentions["attention_mask"])
    scores = queries[:, 0].numpy() @ expected.T
    cands, _ = negatives.lookup([f"m{i}" for i in range(10)])
    np.testing.assert_array_equal(cands.numpy(), np.argsort(-scores, axis=1)[:, :5])
