"""``hnce link`` and ``hnce.EntityLinker``: mentions marked in text linked with a trained model.

Fast: the marked-text parser, bad inputs refused (naming the argument or stdin line) before
any model or Ray starts, and what a candidate shows (its entity's text, cut to the width on
screen and whole in JSON; the reranker's score beside the retriever's). Slow: a tiny bi-encoder trained for 30 steps and its final checkpoint
indexed by ``hnce refresh`` (the session's shared ``trained_run``); then linking finds exactly the model's top k over
the whole catalogue (checked against every entity scored in this process), in the run's
published index version (no version is built: ``<run>/eval-index/`` stays empty), as a table, as
JSON lines and through the Python API, and a joint reranker reorders the retriever's top
candidates by its own scores. ``hnce export`` of that checkpoint is the same retriever outside
hnce: its mention tower through sentence-transformers and its index read with plain faiss
(docs/export.md) find the linker's top k; an export of a checkpoint no refresh indexed builds its
version once, as evaluation does.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import faiss
import numpy as np
import pyarrow.parquet as pq
import pytest
import ray
import torch
from conftest import write_jsonl
from sentence_transformers import SentenceTransformer
from store_helpers import write_checkpoint
from training_helpers import (
    CONFIGS,
    TrainedRun,
    assert_exact_top_k,
    exact_scores,
    poison_weight,
    write_letter_export,
)

import hnce
from hnce.cluster.compute import retrieval
from hnce.cluster.compute.retrieval import EVAL_INDEX_DIR, Retrieved
from hnce.cluster.stores.checkpoints import newest_checkpoint
from hnce.cluster.stores.index_store import IndexStore
from hnce.cluster.stores.tables import Entity, Mention, mention_split_path
from hnce.cluster.stores.tables_read import EntityCatalogue, MentionSplit
from hnce.cluster.stores.tables_write import write_dataset
from hnce.encoders.reranker import build_reranker, export_reranker, load_reranker
from hnce.errors import InputError
from hnce.pipeline.cli.link import PIPED_WIDTH
from hnce.pipeline.cli.main import main as hnce_main
from hnce.pipeline.data.blink import read_blink_mentions
from hnce.pipeline.export import SENTENCE_TRANSFORMERS, export_run
from hnce.pipeline.link import format_linked, marked_mentions

K = 5


# ---------------------------------------------------------------- the marked-text parser


def test_each_marked_span_is_a_mention_with_the_rest_of_the_text_as_context() -> None:
    text = "He met [START_ENT] Paris [END_ENT] in [START_ENT]Texas[END_ENT] ."
    first, second = marked_mentions(text, "argument 1")
    assert (first.mention_id, first.context_left, first.mention, first.context_right) == (
        "argument 1#1",
        "He met",
        "Paris",
        "in Texas .",
    )
    assert (second.mention_id, second.context_left, second.mention, second.context_right) == (
        "argument 1#2",
        "He met Paris in",
        "Texas",
        ".",
    )
    assert first.gold == -1
    only = marked_mentions("[START_ENT] Paris [END_ENT]", "text 1")
    assert [(m.context_left, m.mention, m.context_right) for m in only] == [("", "Paris", "")]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("no marked mention here", "no mention marked"),
        ("a [START_ENT] b", "[START_ENT] without its [END_ENT]"),
        ("a [END_ENT] b", "[END_ENT] without a [START_ENT]"),
        ("a [END_ENT] b [START_ENT] c", "[END_ENT] without a [START_ENT]"),
        ("a [START_ENT] [START_ENT] b [END_ENT] [END_ENT]", "[START_ENT] inside a marked"),
        ("a [START_ENT]  [END_ENT] b", "an empty mention"),
        ("a [START_ENT] b [END_ENT] [START_ENT] c", "[START_ENT] without its [END_ENT]"),
    ],
)
def test_a_malformed_marking_is_an_error_naming_the_input(text: str, problem: str) -> None:
    with pytest.raises(InputError) as raised:
        marked_mentions(text, "stdin line 3")
    assert str(raised.value).startswith("stdin line 3: ")
    assert problem in str(raised.value)


@pytest.fixture
def run_hnce(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    """Run ``hnce`` in this process, stdin given as text or bytes: (exit status, stdout,
    stderr)."""

    def run(*arguments: str, stdin: str | bytes = "") -> tuple[int, str, str]:
        raw = stdin.encode() if isinstance(stdin, str) else stdin
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(raw)))
        capsys.readouterr()
        status = hnce_main(list(arguments))
        out, err = capsys.readouterr()
        return status, out, err

    return run


def test_a_bad_argument_or_stdin_line_is_refused_before_any_work(
    run_hnce, small_dataset: Path, tmp_path: Path
) -> None:
    """The recipe's run has no checkpoint and Ray is never needed: inputs are checked first."""
    recipe = ["--config", str(CONFIGS / "synthetic-test.yaml")]
    recipe += ["--set", f"data.root={small_dataset}", "--set", f"run.dir={tmp_path / 'run'}"]
    good = "the [START_ENT] city [END_ENT] of light"
    status, out, err = run_hnce("link", *recipe, good, "nothing marked")
    assert status == 2 and out == ""
    assert "hnce link: argument 2: no mention marked" in err
    status, out, err = run_hnce("link", *recipe, stdin=f"{good}\n\nan [START_ENT] open span\n")
    assert status == 2 and "hnce link: stdin line 3: [START_ENT] without its [END_ENT]" in err
    status, _, err = run_hnce("link", *recipe, stdin="\n")
    assert status == 2 and "no text to link" in err
    kilt = write_jsonl(
        tmp_path / "aida-kilt.jsonl", [{"id": "q1", "input": good}, {"id": "q2", "input": "none"}]
    )
    status, _, err = run_hnce("link", *recipe, "--kilt", str(kilt))
    assert status == 2 and f"hnce link: {kilt}:2: offsets_outside_context" in err
    assert "--on-bad-row" not in err  # an option of the converters, not of hnce link
    blink = write_jsonl(
        tmp_path / "blink.jsonl",
        [BLINK_LINE, {"context_left": "a", "mention": 3, "context_right": "b"}],
    )
    status, _, err = run_hnce("link", *recipe, "--blink", str(blink))
    assert status == 2 and f"hnce link: {blink}:2: missing_field" in err and "mention" in err
    assert not (tmp_path / "run").exists()


def test_bytes_that_are_not_utf8_are_refused_at_the_edge_naming_line_and_byte(
    run_hnce, small_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stdin, a command-line argument (which Python keeps as lone surrogates) and a file follow
    one rule, checked before any model or Ray starts."""
    monkeypatch.setattr(ray, "init", _ray_must_not_start)
    recipe = ["--config", str(CONFIGS / "synthetic-test.yaml")]
    recipe += ["--set", f"data.root={small_dataset}", "--set", f"run.dir={tmp_path / 'run'}"]
    good = b"the [START_ENT] city [END_ENT] of light\n"
    status, out, err = run_hnce("link", *recipe, stdin=good + b"caf\xe9 [START_ENT] x [END_ENT]\n")
    assert (status, out) == (2, "")
    assert (
        err == "hnce link: stdin line 2: not UTF-8 text: byte 3 (0xe9): invalid continuation byte\n"
    )
    text = os.fsdecode(b"a [START_ENT] \xff [END_ENT]")
    status, _, err = run_hnce("link", *recipe, good.decode(), text)
    assert status == 2
    assert err == "hnce: argument 9: not UTF-8 text: byte 14 (0xff): invalid start byte\n"
    kilt = tmp_path / "aida.jsonl"
    kilt.write_bytes(b'{"id": "q1", "input": "' + good.strip() + b'"}\n{"id": "q\xc3"}\n')
    status, _, err = run_hnce("link", *recipe, "--kilt", str(kilt))
    assert status == 2
    assert err.startswith(f"hnce link: {kilt}:2: invalid_utf8: not UTF-8 text: byte 9 (0xc3)")
    assert not (tmp_path / "run").exists()


def test_an_export_with_a_non_finite_weight_is_refused_before_ray_starts(
    run_hnce, small_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver checks the weights it hashes anyway; no actor is started to find them NaN."""
    export = write_letter_export(tmp_path / "export", "dual")
    weights_file, name = poison_weight(export)
    recipe = ["--config", str(CONFIGS / "synthetic-test.yaml")]
    recipe += ["--set", f"data.root={small_dataset}", "--set", f"run.dir={tmp_path / 'run'}"]
    monkeypatch.setattr(ray, "init", _ray_must_not_start)
    status, out, err = run_hnce(
        "link", *recipe, "--export", str(export), "a [START_ENT] b [END_ENT]"
    )
    assert (status, out) == (2, "")
    assert err == (
        f"hnce link: {weights_file}: weight {name} is not finite (NaN or infinite); "
        "refusing to encode with this model\n"
    )


def _ray_must_not_start(*args: object, **kwargs: object) -> None:
    raise AssertionError("Ray started for an input the driver can check")


BLINK_LINE = {"id": 7, "context_left": "the", "mention": "city", "context_right": "of light"}


def test_a_blink_mention_file_reads_as_mentions(tmp_path: Path) -> None:
    blink = write_jsonl(
        tmp_path / "blink.jsonl",
        [BLINK_LINE, {"context_left": "", "mention": "Paris", "context_right": "", "label": "x"}],
    )
    assert read_blink_mentions(blink) == [
        Mention("7", "the", "city", "of light", -1),
        Mention(f"{blink}:2", "", "Paris", "", -1),
    ]


def test_an_empty_catalogue_is_refused_before_any_work(run_hnce, tmp_path: Path) -> None:
    write_dataset(tmp_path / "empty", [])
    recipe = ["--config", str(CONFIGS / "synthetic-test.yaml")]
    recipe += ["--set", f"data.root={tmp_path / 'empty'}", "--set", f"run.dir={tmp_path / 'run'}"]
    status, out, err = run_hnce("link", *recipe, "the [START_ENT] city [END_ENT] of light")
    assert status == 2 and out == ""
    assert "'data.root' is" in err and "its catalogue holds no entity" in err
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- what a candidate shows

BANK = [  # WordNet's first senses of "bank": one title, told apart only by their texts
    ("bank.n.01", "sloping land (especially the slope beside a body of water)"),
    (
        "bank.n.02",
        "a financial institution that accepts deposits and channels the money into "
        'lending activities; "he cashed a check at the bank"',
    ),
    ("bank.n.03", 'a long ridge or pile; "a huge bank of earth"'),
]


@pytest.fixture
def bank_linker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> hnce.EntityLinker:
    """A linker over the senses of "bank" whose search (the cluster's part) always finds them
    in the catalogue's order with scores 0.9, 0.8, 0.7: what it shows of them is under test."""
    data = tmp_path / "bank"
    write_dataset(data, [Entity(i, key, "bank", text) for i, (key, text) in enumerate(BANK)])
    recipe = [f"data.root={data}", f"run.dir={tmp_path / 'run'}"]
    config = hnce.load_config(CONFIGS / "synthetic-test.yaml", recipe)
    linker = hnce.EntityLinker(config, model=None, name="found in the catalogue's order")

    def search(mentions: list[Mention], k: int) -> Retrieved:
        found = np.tile(np.arange(k) % len(BANK), (len(mentions), 1))
        scores = np.tile(0.9 - 0.1 * np.arange(k, dtype=np.float32), (len(mentions), 1))
        return Retrieved(found, scores, index_version=None, built=False)

    monkeypatch.setattr(linker, "search", search)
    return linker


RIVER = "He sat on the [START_ENT] bank [END_ENT] of the river."


def test_linked_candidates_carry_their_entitys_text(bank_linker: hnce.EntityLinker) -> None:
    (linked,) = bank_linker.link([RIVER], k=3)
    assert [(c.key, c.title, c.text) for c in linked.candidates] == [
        (key, "bank", text) for key, text in BANK
    ]
    assert [c.rerank_score for c in linked.candidates] == [None] * 3
    candidates = linked.to_json()["candidates"]
    assert [c["text"] for c in candidates] == [text for _, text in BANK]  # whole, not cut
    assert candidates[0] == {
        "rank": 1,
        "key": "bank.n.01",
        "title": "bank",
        "score": pytest.approx(0.9),
        "text": BANK[0][1],
        "rerank_score": None,
    }


@pytest.mark.parametrize("width", [60, 100, 200])
def test_the_table_shows_the_start_of_each_text_within_the_width(
    bank_linker: hnce.EntityLinker, width: int
) -> None:
    (linked,) = bank_linker.link([RIVER], k=3)
    table = format_linked([linked], width).splitlines()
    assert table[0] == "text 1#1: He sat on the [bank] of the river."
    assert [cell.strip() for cell in table[1].split(" | ")] == [
        "rank",
        "key",
        "title",
        "score",
        "text",
    ]
    rows = [line.split(" | ") for line in table[3:]]
    assert [row[1].strip() for row in rows] == [key for key, _ in BANK]
    for row, (_, text) in zip(rows, BANK, strict=True):
        shown = row[-1].rstrip()
        assert shown == text or (shown.endswith("…") and text.startswith(shown[:-1]))
    assert all(len(line.rstrip()) <= width for line in table[1:])
    assert (rows[1][-1].rstrip() == BANK[1][1]) == (width == 200)


def test_with_a_reranker_both_scores_are_shown(
    bank_linker: hnce.EntityLinker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reranker puts the third sense first: each candidate keeps its retriever score and
    shows the reranker's beside it, on screen and in JSON."""

    def rerank(reranker, tokens, found, depth, batch_size):
        order = np.tile([2, 0, 1], (len(found.mentions), 1))
        judged = np.tile(np.asarray([5.0, 3.0, 1.0], dtype=np.float32), (len(found.mentions), 1))
        return np.take_along_axis(found.cands[:, :3], order, axis=1), judged

    monkeypatch.setattr("hnce.pipeline.link.rerank", rerank)
    bank_linker.reranker = object()  # what rerank is given; the stand-in above ignores it
    bank_linker._reranker_tokens = object()
    (linked,) = bank_linker.link([RIVER], k=2)
    assert [(c.key, c.rerank_score) for c in linked.candidates] == [
        ("bank.n.03", 5.0),
        ("bank.n.01", 3.0),
    ]
    assert [c.score for c in linked.candidates] == pytest.approx([0.7, 0.9])
    assert [c["rerank_score"] for c in linked.to_json()["candidates"]] == [5.0, 3.0]
    table = format_linked([linked], 100).splitlines()
    assert [cell.strip() for cell in table[1].split(" | ")][3:5] == ["score", "rerank"]
    assert [cell.strip() for cell in table[3].split(" | ")][3:5] == ["0.7000", "5.0000"]


def test_link_writes_a_fixed_width_table_where_stdout_is_no_terminal(
    run_hnce, bank_linker: hnce.EntityLinker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hnce.EntityLinker, "from_config", lambda *args: bank_linker)
    monkeypatch.setenv("COLUMNS", "300")  # the terminal's width, not asked for a pipe
    recipe = ["--config", str(CONFIGS / "synthetic-test.yaml")]
    status, out, err = run_hnce("link", *recipe, "-k", "3", RIVER)
    assert status == 0, err
    assert max(len(line.rstrip()) for line in out.splitlines()) <= PIPED_WIDTH
    assert "| sloping land (especially the slope beside a body of water)" in out
    status, out, err = run_hnce("link", *recipe, "-k", "3", "--json", RIVER)
    assert status == 0, err
    assert [c["text"] for c in json.loads(out)["candidates"]] == [text for _, text in BANK]


# ---------------------------------------------------------------- a trained run


def marked(mention: Mention) -> str:
    return f"{mention.context_left} [START_ENT] {mention.mention} [END_ENT] {mention.context_right}"


def exact(run: Path, data_root: Path, mentions: list[Mention]) -> np.ndarray:
    """Scores [M, E] of each mention against every entity, computed in this process by the run's
    newest checkpoint."""
    newest = newest_checkpoint(run)
    assert newest is not None
    return exact_scores(newest[1] / "export", data_root, mentions)


def assert_exact(found_keys: list[list[str]], scores: np.ndarray, data_root: Path) -> None:
    """Each mention's linked keys are its k best entities under ``scores``, best first (up to
    float rounding: near-ties may come in either order)."""
    ids = EntityCatalogue.open(data_root).ids_for_keys([key for keys in found_keys for key in keys])
    assert_exact_top_k(ids.reshape(len(found_keys), -1), scores)


@pytest.fixture(scope="module")
def linkable(trained_run: TrainedRun) -> list[Mention]:
    """Two training mentions whose gold the trained model ranks among its top K (the two best
    ranked), so that linking them must find their gold."""
    mentions = MentionSplit.open(mention_split_path(trained_run.data, "train")).read_all()
    scores = exact(trained_run.run, trained_run.data, mentions)
    golds = np.asarray([m.gold for m in mentions])
    ranks = (scores > scores[np.arange(len(mentions)), golds][:, None]).sum(axis=1)
    best = np.argsort(ranks, kind="stable")[:2]
    assert ranks[best].max() < K, ranks[best]
    return [mentions[i] for i in best]


def assert_nothing_built(run: Path) -> None:
    """Linking searched the version the refresh published: the refresh's store holds that one
    version and ``<run>/eval-index/`` none (a version encoded to link would land there)."""
    assert len(IndexStore(run / "index").versions()) == 1
    assert IndexStore(run / EVAL_INDEX_DIR).versions() == []


@pytest.mark.slow
def test_link_prints_the_gold_among_the_exact_top_k_from_the_published_index(
    run_hnce, trained_run: TrainedRun, linkable: list[Mention]
) -> None:
    recipe = ["--config", str(trained_run.run / "config.yaml")]
    status, out, err = run_hnce("link", *recipe, "-k", str(K), marked(linkable[0]))
    assert status == 0, err
    assert_nothing_built(trained_run.run)
    catalogue = EntityCatalogue.open(trained_run.data)
    gold = catalogue.get(linkable[0].gold)
    rows = [line.split(" | ") for line in out.splitlines() if " | " in line][1:]
    assert [int(row[0]) for row in rows] == list(range(1, K + 1))
    assert [gold.key, gold.title] in [[cell.strip() for cell in row[1:3]] for row in rows]
    assert_exact(
        [[row[1].strip() for row in rows]],
        exact(trained_run.run, trained_run.data, linkable[:1]),
        trained_run.data,
    )
    assert out.splitlines()[0].startswith("argument 1#1: ")


@pytest.mark.slow
def test_link_json_lines_from_stdin_one_object_per_mention(
    run_hnce, trained_run: TrainedRun, linkable: list[Mention]
) -> None:
    stdin = "\n".join(marked(mention) for mention in linkable) + "\n"
    recipe = ["--config", str(trained_run.run / "config.yaml")]
    status, out, err = run_hnce("link", *recipe, "-k", str(K), "--json", stdin=stdin)
    assert status == 0, err
    assert_nothing_built(trained_run.run)
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["id"] for line in lines] == ["stdin line 1#1", "stdin line 2#1"]
    catalogue = EntityCatalogue.open(trained_run.data)
    for line, mention in zip(lines, linkable, strict=True):
        assert line["mention"] == mention.mention
        candidates = line["candidates"]
        assert [c["rank"] for c in candidates] == list(range(1, K + 1))
        assert catalogue.get(mention.gold).title in [c["title"] for c in candidates]
    keys = [[c["key"] for c in line["candidates"]] for line in lines]
    assert_exact(keys, exact(trained_run.run, trained_run.data, linkable), trained_run.data)


@pytest.mark.slow
def test_python_api_links_reuses_the_index_and_agrees_with_its_own_vectors(
    trained_run: TrainedRun, linkable: list[Mention]
) -> None:
    linker = hnce.EntityLinker.from_run(trained_run.run)
    texts = [marked(mention) for mention in linkable]
    cold = linker.search(marked_mentions(texts[0], "text 1"), K)
    assert cold.built is False and {"start", "hold", "search"} <= set(cold.seconds)
    assert_nothing_built(trained_run.run)
    linked = linker.link(texts, k=K)
    warm = linker.search(marked_mentions(texts[0], "text 1"), K)
    assert set(warm.seconds) == {"search"}  # nothing started or loaded again
    np.testing.assert_array_equal(warm.cands, cold.cands)
    assert [item.mention.mention for item in linked] == [m.mention for m in linkable]
    gold = EntityCatalogue.open(trained_run.data).get(linkable[0].gold)
    assert (gold.key, gold.title) in [(c.key, c.title) for c in linked[0].candidates]
    # dual: a candidate's score is its mention vector times its entity vector
    queries = linker.encode_mentions(texts)
    ids = linker.catalogue.ids_for_keys([c.key for c in linked[1].candidates])
    vectors, owners = linker.encode_entities(ids)
    np.testing.assert_array_equal(owners, ids)
    np.testing.assert_allclose(
        vectors @ queries[1, 0], [c.score for c in linked[1].candidates], rtol=0, atol=1e-4
    )


def plain_faiss_top_k(
    index_dir: Path, queries: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """(entity ids [M, k], scores [M, k]) of each query in an exported index, read as
    docs/export.md's snippet reads it: each shard with plain faiss, its rows' entity ids from its
    ids array, the best k of the shards' top k."""
    manifest = json.loads((index_dir / "manifest.json").read_text())
    found_scores, found_ids = [], []
    for shard in manifest["shards"]:
        index = faiss.read_index(str(index_dir / shard["file"]))
        ids = np.load(index_dir / shard["ids"])
        scores, rows = index.search(queries, k)
        found_scores.append(scores)
        found_ids.append(np.where(rows >= 0, ids[rows], -1))
    scores, ids = np.concatenate(found_scores, axis=1), np.concatenate(found_ids, axis=1)
    best = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(ids, best, axis=1), np.take_along_axis(scores, best, axis=1)


@pytest.mark.slow
def test_the_exported_pair_finds_what_the_linker_finds_for_that_checkpoint(
    run_hnce, tmp_path: Path, trained_run: TrainedRun, hf_modules_cache: None
) -> None:
    """``hnce export`` of the newest checkpoint carries the version the refresh published for it
    (nothing is built); the exported mention tower through sentence-transformers and the exported
    index read with plain faiss give each of the eval split's mentions the linker's top K: the
    same entities (both the exact top K, so up to float near-ties) with the same scores, and
    ``index/keys.parquet`` names them by the catalogue's keys."""
    out = tmp_path / "model"
    status, printed, err = run_hnce("export", str(trained_run.run), "--out", str(out))
    assert status == 0, err
    assert f"index: {out / 'index'}" in printed
    assert_nothing_built(trained_run.run)
    step, _ = newest_checkpoint(trained_run.run)
    assert json.loads((out / "export.json").read_text())["checkpoint"] == step

    mentions = MentionSplit.open(mention_split_path(trained_run.data, "test")).read_all()
    tower = SentenceTransformer(str(out / "mention"), device="cpu", trust_remote_code=True)
    texts = [marked(mention) for mention in mentions]  # whole contexts: the window cuts them
    ids, scores = plain_faiss_top_k(out / "index", tower.encode(texts), K)
    with hnce.EntityLinker.from_run(trained_run.run) as linker:
        linked = linker.search(mentions, K)
    assert linked.built is False
    truth = exact(trained_run.run, trained_run.data, mentions)
    assert_exact_top_k(ids, truth)
    assert_exact_top_k(linked.cands, truth)
    np.testing.assert_allclose(scores, linked.scores, rtol=0, atol=1e-4)
    keys = pq.read_table(out / "index" / "keys.parquet")["key"].to_pylist()
    catalogue = EntityCatalogue.open(trained_run.data)
    assert [keys[i] for i in ids[0]] == [catalogue.get(int(i)).key for i in ids[0]]


@pytest.mark.slow
def test_an_export_of_a_checkpoint_no_refresh_indexed_builds_its_version_once(
    tmp_path: Path, trained_run: TrainedRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run holding the trained checkpoint and no index (as one written after the last
    refresh): its export builds the checkpoint's version into ``<run>/eval-index/`` through the
    encoder actors, never into ``<run>/index/``; a second export finds that version (no encoder
    pool starts), and both carry it."""
    step, directory = newest_checkpoint(trained_run.run)
    run_dir = tmp_path / "run"
    write_checkpoint(run_dir, step, directory / "export")
    # the trained run's recipe, which the export reads as this run's (run.dir: this one)
    shutil.copy(trained_run.run / "config.yaml", run_dir / "config.yaml")
    export_run(run_dir, "newest", SENTENCE_TRANSFORMERS, tmp_path / "first")
    assert IndexStore(run_dir / EVAL_INDEX_DIR).versions() == [1]
    assert not (run_dir / "index").exists()

    def never(*_: object) -> None:
        raise AssertionError("an encoder pool was started")

    monkeypatch.setattr(retrieval, "start_pool", never)
    export_run(run_dir, "newest", SENTENCE_TRANSFORMERS, tmp_path / "second")
    assert IndexStore(run_dir / EVAL_INDEX_DIR).versions() == [1]
    first, second = (
        json.loads((tmp_path / name / "index" / "manifest.json").read_text())
        for name in ("first", "second")
    )
    assert first == second
    published = IndexStore(trained_run.run / "index").current()
    assert first["model"] == published.manifest.model  # the same model's, wherever it lies


@pytest.fixture(scope="module")
def reranker_export(tmp_path_factory: pytest.TempPathFactory, syllable_bert: Path) -> Path:
    """An (untrained, seeded) joint reranker over the tiny BERT, exported as ``hnce rerank``
    exports one."""
    torch.manual_seed(1)
    reranker = build_reranker(syllable_bert, mention_length=24, entity_length=24)
    export = tmp_path_factory.mktemp("reranker") / "export"
    export_reranker(reranker, export)
    return export


@pytest.mark.slow
def test_rerank_orders_the_retrievers_top_candidates_by_the_rerankers_scores(
    run_hnce,
    trained_run: TrainedRun,
    linkable: list[Mention],
    reranker_export: Path,
) -> None:
    # the retriever's candidates: its top `depth`, cut where no near-tie straddles the cut
    scores = exact(trained_run.run, trained_run.data, linkable[1:])[0]
    ranked = np.sort(scores)[::-1]
    depth = next(n for n in range(K + 3, len(ranked)) if ranked[n - 1] - ranked[n] > 1e-3)
    recipe = ["--config", str(trained_run.run / "config.yaml")]
    recipe += ["--set", f"rerank.num_candidates={depth}"]
    arguments = [*recipe, "-k", str(K), "--json", "--rerank", str(reranker_export)]
    status, out, err = run_hnce("link", *arguments, marked(linkable[1]))
    assert status == 0, err
    assert_nothing_built(trained_run.run)
    (line,) = [json.loads(text) for text in out.splitlines()]
    # the oracle: those candidates scored one by one by the reranker
    catalogue = EntityCatalogue.open(trained_run.data)
    retrieved = np.argsort(-scores, kind="stable")[:depth]
    entities = catalogue.get_many(retrieved.tolist())
    reranker = load_reranker(reranker_export)
    mention = linkable[1]
    with torch.inference_mode():
        judged = reranker.score_candidates(
            reranker.tokenize_mentions(
                [mention.context_left], [mention.mention], [mention.context_right]
            ),
            reranker.tokenize_entities([e.title for e in entities], [e.text for e in entities]),
        ).numpy()
    keys = [c["key"] for c in line["candidates"]]
    positions = [[e.key for e in entities].index(key) for key in keys]
    assert_exact_top_k(np.asarray([positions]), judged)
    shown = [c["rerank_score"] for c in line["candidates"]]
    np.testing.assert_allclose(shown, judged[0][positions], rtol=0, atol=1e-4)
    assert [c["rank"] for c in line["candidates"]] == list(range(1, K + 1))
    assert keys != [e.key for e in entities[:K]], "the reranker kept the retriever's order"
