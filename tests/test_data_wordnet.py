"""WordNet converter on hand-written data files in the wndb format, and on the real files."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest

from hnce import progress
from hnce.cluster.stores.tables import Mention, mention_split_path
from hnce.cluster.stores.tables_read import EntityCatalogue, MentionSplit
from hnce.pipeline.data.bad_rows import BadRowError
from hnce.pipeline.data.conversion import DatasetOutput
from hnce.pipeline.data.wordnet import (
    convert_wordnet,
    lemma_forms,
    parse_data_line,
    split_for_lemma,
)

HEADER = (
    "  1 This software and database is being provided to you, the LICENSEE, by  \n"
    '  2 Princeton University under the following license.  "AS IS" and so on  \n'
)
NOUN = (
    "02084071 05 n 03 dog 0 domestic_dog 0 Canis_familiaris 0 000 | a member of the genus Canis; "
    '"the dog barked all night"; "two domestic dogs"  \n'
    '10114209 18 n 01 dog 1 000 | a dull unattractive unpleasant girl or woman; "she got a reputation as a frump"  \n'
    '03719053 06 n 01 mouse 0 000 | a hand-operated device; "Zoë clicked the mice twice"  \n'
)
VERB = (
    "01950798 38 v 01 run 0 000 | move fast by using one's feet; "
    '"Don\'t run--you\'ll be late"; "He ran to the store"  \n'
    '02000868 38 v 02 dog 0 chase 0 000 02 + 01 00 | go after with the intent to catch; "The policeman dogged the suspect"  \n'
)
ADJ = '00001740 00 a 01 able(a) 0 000 | having the means; "she was abler than most"  \n'


@pytest.fixture
def wordnet_dir(tmp_path: Path) -> Path:
    root = tmp_path / "wordnet"
    root.mkdir()
    (root / "data.noun").write_text(HEADER + NOUN, encoding="utf-8")
    (root / "data.verb").write_text(HEADER + VERB, encoding="utf-8")
    (root / "data.adj").write_text(HEADER + ADJ, encoding="utf-8")
    (root / "data.adv").write_text(HEADER, encoding="utf-8")
    (root / "noun.exc").write_text("mice mouse\n", encoding="utf-8")
    (root / "verb.exc").write_text("ran run\n", encoding="utf-8")
    return root


def test_a_data_line_gives_the_synsets_key_lemmas_title_definition_and_examples() -> None:
    synset = parse_data_line(NOUN.splitlines()[0], "n", "noun")
    assert synset.key == "n.02084071"
    assert synset.lemmas == ("dog", "domestic dog", "Canis familiaris")
    assert synset.title == "dog"
    assert synset.definition == "a member of the genus Canis"
    assert synset.examples == ("the dog barked all night", "two domestic dogs")
    assert synset.text == "dog, domestic dog, Canis familiaris: a member of the genus Canis"
    assert parse_data_line(ADJ, "a", "adj").lemmas == ("able",)


def test_lemma_forms_add_regular_inflections_and_listed_exceptions() -> None:
    assert {"dogs", "dog"} <= lemma_forms("dog", "noun", {})
    assert "domestic dogs" in lemma_forms("domestic dog", "noun", {})
    assert {"dogged", "dogging", "dogs"} <= lemma_forms("dog", "verb", {})
    assert "looked up" in lemma_forms("look up", "verb", {})
    assert "ran" in lemma_forms("run", "verb", {"run": {"ran"}})
    assert "abler" in lemma_forms("able", "adj", {})


@pytest.fixture
def converted(
    wordnet_dir: Path, tmp_path: Path
) -> tuple[dict, EntityCatalogue, dict[str, Mention]]:
    """The hand-written files converted (seed 0): the summary, the catalogue, and every split's
    mentions by id."""
    summary = convert_wordnet(tmp_path / "out", wordnet_dir, seed=0)
    catalogue = EntityCatalogue.open(tmp_path / "out")
    mentions = {
        m.mention_id: m
        for split in ("train", "dev", "test")
        for m in MentionSplit.open(mention_split_path(tmp_path / "out", split)).read_all()
    }
    return summary, catalogue, mentions


def test_every_synset_becomes_an_entity_whose_text_leaves_out_the_examples(
    converted: tuple[dict, EntityCatalogue, dict[str, Mention]],
) -> None:
    summary, catalogue, _ = converted
    assert len(catalogue) == summary["entities"] == 6
    assert [e.key for e in catalogue.get_many(range(6))] == [
        "n.02084071",
        "n.10114209",
        "n.03719053",
        "v.01950798",
        "v.02000868",
        "a.00001740",
    ]
    frump = catalogue.get(1)
    assert (frump.title, frump.text) == ("dog", "dog: a dull unattractive unpleasant girl or woman")
    assert "frump" not in frump.text  # examples never go into the entity text


def test_an_example_is_a_mention_of_the_form_of_its_synsets_lemma_it_contains(
    converted: tuple[dict, EntityCatalogue, dict[str, Mention]],
) -> None:
    summary, _, mentions = converted
    # "frump" does not contain the synset's lemma: not a mention, but counted
    assert summary["examples"] == 8
    assert summary["examples_without_lemma"] == 1
    assert set(mentions) == {
        "n.02084071.0",
        "n.02084071.1",
        "n.03719053.0",
        "v.01950798.0",
        "v.01950798.1",
        "v.02000868.0",
        "a.00001740.0",
    }
    barked = mentions["n.02084071.0"]
    assert (barked.context_left, barked.mention, barked.context_right, barked.gold) == (
        "the",
        "dog",
        "barked all night",
        0,
    )
    domestic = mentions["n.02084071.1"]
    assert (domestic.context_left, domestic.mention, domestic.context_right) == (
        "two",
        "domestic dogs",
        "",
    )
    mice = mentions["n.03719053.0"]
    assert (mice.context_left, mice.mention, mice.context_right, mice.gold) == (
        "Zoë clicked the",
        "mice",
        "twice",
        2,
    )
    assert mentions["v.01950798.0"].mention == "run"
    assert mentions["v.01950798.1"].mention == "ran"
    assert (mentions["v.02000868.0"].mention, mentions["v.02000868.0"].gold) == ("dogged", 4)
    assert mentions["a.00001740.0"].mention == "abler"


def test_ambiguity_is_counted_within_a_part_of_speech_and_across_them(
    converted: tuple[dict, EntityCatalogue, dict[str, Mention]],
) -> None:
    summary, _, _ = converted
    # "dog" names 2 noun synsets: the two noun-dog mentions are ambiguous within their POS; the
    # verb "dog" mention is ambiguous only across parts of speech
    assert summary["ambiguous_total"] == 1
    assert summary["ambiguous_any_pos_total"] == 2
    assert summary["mentions_total"] == 7


def test_split_keeps_lemmas_apart_and_is_seeded() -> None:
    lemmas = [f"lemma{i}" for i in range(2000)]
    splits = [split_for_lemma(lemma, seed=0) for lemma in lemmas]
    assert splits == [split_for_lemma(lemma, seed=0) for lemma in lemmas]
    assert splits != [split_for_lemma(lemma, seed=1) for lemma in lemmas]
    assert 0.75 < splits.count("train") / len(splits) < 0.85
    assert splits.count("dev") > 100 and splits.count("test") > 100


@pytest.mark.slow
def test_real_wordnet_converts_every_synset_and_over_a_thousand_mentions_per_split(
    real_wordnet: tuple[Path, dict],
) -> None:
    root, summary = real_wordnet
    assert summary["entities"] == 117_659
    assert summary["mentions_total"] >= 45_000
    assert summary["ambiguous_total"] > summary["mentions_total"] / 2
    for split in ("train", "dev", "test"):
        path = mention_split_path(root, split)
        assert len(MentionSplit.open(path)) == summary["mentions"][split] > 1000


BAD_WORDNET_LINES = {
    "missing_field": b"02084072 05 n zz dog 0 000 | not a word count\n",
    "duplicate_key": NOUN.splitlines(keepends=True)[0].encode(),
    "invalid_utf8": b"02084073 05 n 01 d\xf6g 0 000 | latin-1, not UTF-8\n",
}


@pytest.mark.parametrize("kind", sorted(BAD_WORDNET_LINES))
def test_a_bad_wordnet_line_fails_strict_mode_and_is_rejected_in_skip_mode(
    wordnet_dir: Path, tmp_path: Path, kind: str
) -> None:
    data_noun = wordnet_dir / "data.noun"
    data_noun.write_bytes(data_noun.read_bytes() + BAD_WORDNET_LINES[kind])
    with pytest.raises(BadRowError, match=rf"{data_noun}:6: {kind}"):
        convert_wordnet(tmp_path / "strict", wordnet_dir)
    output = DatasetOutput(tmp_path / "skip", on_bad_row="skip", rejects=tmp_path / "r.jsonl")
    summary = convert_wordnet(output, wordnet_dir)
    assert summary["bad_rows"]["rejected"] == {
        name: int(name == kind) for name in summary["bad_rows"]["rejected"]
    }
    assert summary["entities"] == 6 and summary["mentions_total"] == 7
    assert json.loads((tmp_path / "r.jsonl").read_text())["line"] == 6


def test_the_conversion_reports_progress_as_the_process_is_told(
    wordnet_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Off a terminal, log lines (``hnce.progress``), never a bar redrawn into the log; inside
    ``quiet()`` (``hnce demo --quiet``, ``hnce data --no-progress``) nothing at all."""
    stderr = io.StringIO()
    monkeypatch.setattr(progress, "_shown", True)
    monkeypatch.setattr("sys.stderr", stderr)
    with caplog.at_level(logging.INFO, logger="hnce.progress"):
        convert_wordnet(tmp_path / "shown", wordnet_dir, seed=0)
        shown = [r.getMessage() for r in caplog.records if r.name == "hnce.progress"]
        caplog.clear()
        with progress.quiet():
            convert_wordnet(tmp_path / "quiet", wordnet_dir, seed=0)
        silent = [r.getMessage() for r in caplog.records if r.name == "hnce.progress"]
    assert any(line.startswith("wordnet noun:") for line in shown), shown
    assert silent == []
    assert "wordnet" not in stderr.getvalue()


def test_a_trained_synsets_later_examples_are_held_out_as_seen_mentions(tmp_path: Path) -> None:
    """The first example of a train-lemma synset stays in train; its second goes to test, its
    third to dev, its fourth to test (seen entities); a dev/test lemma's examples stay where the
    lemma's hash puts them (unseen)."""
    assert split_for_lemma("cat", 0) == "train" and split_for_lemma("tree", 0) == "dev"
    root = tmp_path / "wordnet"
    root.mkdir()
    cat = '02121620 05 n 01 cat 0 000 | a feline; "a cat sat"; "cats purr"; "the cat ran"; "one cat"  \n'
    tree = '13104059 20 n 01 tree 0 000 | a woody plant; "a tree grew"; "old trees"  \n'
    (root / "data.noun").write_text(HEADER + cat + tree, encoding="utf-8")
    for pos in ("verb", "adj", "adv"):
        (root / f"data.{pos}").write_text(HEADER, encoding="utf-8")
    summary = convert_wordnet(tmp_path / "out", root, seed=0)
    where = {
        m.mention_id: split
        for split in ("train", "dev", "test")
        for m in MentionSplit.open(mention_split_path(tmp_path / "out", split)).read_all()
    }
    assert where == {
        "n.02121620.0": "train",
        "n.02121620.1": "test",
        "n.02121620.2": "dev",
        "n.02121620.3": "test",
        "n.13104059.0": "dev",
        "n.13104059.1": "dev",
    }
    assert summary["seen_mentions"] == {"train": 0, "dev": 1, "test": 2}
    assert summary["mentions"] == {"train": 1, "dev": 3, "test": 2}
