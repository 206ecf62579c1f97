"""FOLDOC converter on a hand-written excerpt in dictd's format, and on the real files."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from hnce.cluster.stores.tables import SPLITS, Mention, mention_split_path
from hnce.cluster.stores.tables_read import EntityCatalogue, MentionSplit
from hnce.pipeline.cli.main import main
from hnce.pipeline.data.bad_rows import BadRowError
from hnce.pipeline.data.conversion import DatasetOutput
from hnce.pipeline.data.foldoc import base64_number, convert_foldoc, split_for_entry

BASE64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
META = b"00-database-info\n   The introduction, with a {Lisp} link that is not a mention.\n\n"
LONG_LEFT = " ".join(f"left{i}" for i in range(80))
LONG_RIGHT = " ".join(f"right{i}" for i in range(80))
# entity ids in file order: Lisp 0, Scheme 1, Common Lisp 2, functional 3, flex 4, FLEX 5,
# Lambda Calculus 6, schema 7, Long 8; the second "functional" entry merges into entity 3
ENTRIES = [
    b"Lisp\n\n"
    b"   <language> A {functional} language based on the {lambda\n"
    b"   calculus}.  Dialects: {Scheme}, {Common Lisp (CL)} and {Emacs\n"
    b"   Lisp}.  Home page: {Lisp.org (http://lisp.org/)}.\n\n"
    b"   (1995-01-10)\n\n",
    b"Scheme\n\n"
    b"   1. <language> A small {Lisp} dialect with {closures}.\n\n"
    b"   2. <database> Old spelling of {schema}; see {Scheme}.\n\n"
    b"   (2001-02-03)\n\n",
    b"Common Lisp\nCL\n\n   A {LISP} standard, bigger than {Scheme}.\n\n",
    b"functional\n\n   Of {FLEX} and {Flex}.\n\n",
    b"flex\n\n   A {lexer} generator.\n\n",
    b"FLEX\n\n   A language.\n\n",
    b"Lambda Calculus\n\n   A formal system.\n\n",
    b"schema\n\n   A description of a database.\n\n",
    f"Long\n\n   {LONG_LEFT} {{Scheme}} {LONG_RIGHT}\n\n".encode(),
    b"functional\n\n       <Debian> Like {Scheme}.\n\n",
]


def b64(number: int) -> str:
    digits = BASE64[number % 64]
    while number >= 64:
        number //= 64
        digits = BASE64[number % 64] + digits
    return digits


def write_dictd(directory: Path, entries: list[bytes], index_tail: str = "") -> Path:
    """``foldoc.dict.dz`` (the metadata entry, then ``entries``) and ``foldoc.index`` (every
    name line of an entry, lowercased, as dictfmt writes it) in ``directory``."""
    directory.mkdir(exist_ok=True)
    data = b""
    index = []
    for raw in [META, *entries]:
        names = raw.split(b"\n\n")[0].decode("utf-8", "replace").split("\n")
        names = names[:1] if raw is META else names
        index += [f"{name.lower()}\t{b64(len(data))}\t{b64(len(raw))}" for name in names]
        data += raw
    (directory / "foldoc.dict.dz").write_bytes(gzip.compress(data))
    (directory / "foldoc.index").write_text("\n".join(sorted(index)) + "\n" + index_tail)
    return directory


def splits_of(root: Path) -> dict[str, dict[str, Mention]]:
    return {
        split: {
            m.mention_id: m for m in MentionSplit.open(mention_split_path(root, split)).read_all()
        }
        for split in SPLITS
    }


def seed_splitting(wanted: dict[str, str]) -> int:
    """The first seed that puts each entry key of ``wanted`` in its split."""
    return next(
        seed
        for seed in range(100_000)
        if all(split_for_entry(key, seed) == split for key, split in wanted.items())
    )


# Lisp and functional link from train, Scheme and Common Lisp from test, Long from dev
SEED = seed_splitting(
    {"Lisp": "train", "functional": "train", "Scheme": "test", "Common Lisp": "test", "Long": "dev"}
)


@pytest.fixture
def converted(tmp_path: Path) -> tuple[dict, EntityCatalogue, dict[str, dict[str, Mention]]]:
    """The excerpt converted: the summary, the catalogue, every split's mentions by id."""
    summary = convert_foldoc(tmp_path / "out", write_dictd(tmp_path / "dictd", ENTRIES), SEED)
    return summary, EntityCatalogue.open(tmp_path / "out"), splits_of(tmp_path / "out")


def all_mentions(splits: dict[str, dict[str, Mention]]) -> dict[str, Mention]:
    return {mention_id: m for mentions in splits.values() for mention_id, m in mentions.items()}


def test_base64_numbers_are_read_most_significant_digit_first() -> None:
    assert [base64_number(digits) for digits in ("A", "/", "BA", "Gb9L")] == [0, 63, 64, 1687371]
    assert all(base64_number(b64(n)) == n for n in (0, 1, 63, 64, 4095, 4096, 5_578_809))
    with pytest.raises(ValueError, match="not a base64 number"):
        base64_number("1-2")


def test_one_entity_per_headword_with_its_text_cleaned(
    converted: tuple[dict, EntityCatalogue, dict[str, dict[str, Mention]]],
) -> None:
    summary, catalogue, _ = converted
    assert summary["entries"] == 10  # the metadata entry is not one; two share a headword
    assert len(catalogue) == summary["entities"] == 9
    assert [(e.key, e.title) for e in catalogue.get_many(range(9))] == [
        (key, key)
        for key in (
            "Lisp",
            "Scheme",
            "Common Lisp",
            "functional",
            "flex",
            "FLEX",
            "Lambda Calculus",
            "schema",
            "Long",
        )
    ]
    # braces gone, web and labelled links shown as their text, date stamps dropped
    assert catalogue.get(0).text == (
        "<language> A functional language based on the lambda calculus. Dialects: Scheme, "
        "Common Lisp and Emacs Lisp. Home page: Lisp.org."
    )
    # numbered senses stay in one entity
    assert catalogue.get(1).text == (
        "1. <language> A small Lisp dialect with closures. "
        "2. <database> Old spelling of schema; see Scheme."
    )
    # entries of one headword are one entity, texts in file order
    assert catalogue.get(3).text == "Of FLEX and Flex. <Debian> Like Scheme."
    assert all(e.domain == "" for e in catalogue.get_many(range(9)))


def test_each_link_to_another_entry_is_a_mention_in_its_context(
    converted: tuple[dict, EntityCatalogue, dict[str, dict[str, Mention]]],
) -> None:
    _, _, splits = converted
    mentions = all_mentions(splits)
    assert {mention_id: m.gold for mention_id, m in mentions.items()} == {
        "Lisp#0": 3,  # exact
        "Lisp#1": 6,  # {lambda calculus}: case differs, one entry matches
        "Lisp#2": 1,
        "Lisp#3": 2,  # {Common Lisp (CL)}: labelled, CL is a name of Common Lisp
        "Scheme#0": 0,
        "Scheme#2": 7,
        "Common Lisp#0": 0,  # {LISP}
        "Common Lisp#1": 1,
        "functional#0": 5,  # {FLEX}: exact beats flex
        "functional#2": 1,  # in the second entry of the headword: numbering goes on
        "Long#0": 1,
    }
    scheme = mentions["Lisp#2"]
    assert (scheme.context_left, scheme.mention, scheme.context_right, scheme.domain) == (
        "<language> A functional language based on the lambda calculus. Dialects:",
        "Scheme",
        ", Common Lisp and Emacs Lisp. Home page: Lisp.org.",
        "",
    )
    assert (mentions["Lisp#1"].mention, mentions["Lisp#3"].mention) == (
        "lambda calculus",
        "Common Lisp",
    )
    assert mentions["Common Lisp#0"].mention == "LISP"
    long = mentions["Long#0"]
    assert len(long.context_left) <= 300 and len(long.context_right) <= 300
    # whole words next to the mention, up to 300 characters
    assert (" " + LONG_LEFT).endswith(" " + long.context_left) and len(long.context_left) > 250
    assert (LONG_RIGHT + " ").startswith(long.context_right + " ")
    assert len(long.context_right) > 250


def test_web_missing_ambiguous_and_self_links_are_counted_not_mentions(
    converted: tuple[dict, EntityCatalogue, dict[str, dict[str, Mention]]],
) -> None:
    summary, _, _ = converted
    assert summary["links"] == {
        "total": 17,  # the metadata entry's link is not counted
        "resolved": {"exact": 8, "case_insensitive": 2, "labelled": 1},
        "self": 1,  # Scheme#3
        "web": 1,  # Lisp#5
        # Emacs Lisp, closures, lexer; {Flex} matches flex and FLEX ignoring case
        "missing": {"no_entry": 3, "ambiguous": 1},
    }
    assert summary["mentions_total"] == 11


def test_the_split_is_by_linking_entry_and_counts_golds_seen_in_training(
    converted: tuple[dict, EntityCatalogue, dict[str, dict[str, Mention]]],
) -> None:
    summary, _, splits = converted
    for split, mentions in splits.items():
        assert {split_for_entry(m.rpartition("#")[0], SEED) for m in mentions} <= {split}
    assert {split: sorted(mentions) for split, mentions in splits.items()} == {
        "train": ["Lisp#0", "Lisp#1", "Lisp#2", "Lisp#3", "functional#0", "functional#2"],
        "dev": ["Long#0"],
        "test": ["Common Lisp#0", "Common Lisp#1", "Scheme#0", "Scheme#2"],
    }
    assert summary["mentions"] == {"train": 6, "dev": 1, "test": 4}
    # train links to functional, lambda calculus, Scheme, Common Lisp, FLEX: Scheme is seen,
    # Lisp (twice) and schema are not
    assert summary["seen"] == {"dev": 1, "test": 1}
    assert summary["unseen"] == {"dev": 0, "test": 3}


def _with_bad_row(kind: str, directory: Path) -> tuple[Path, int]:
    """The excerpt with one bad row of ``kind``: the file to blame and its 1-based line."""
    if kind == "missing_field":
        write_dictd(directory, ENTRIES, index_tail="broken\tline\n")
        lines = (directory / "foldoc.index").read_text().splitlines()
        return directory / "foldoc.index", len(lines)
    bad = {
        "invalid_utf8": ENTRIES[7].replace(b"database", b"datab\xe4se"),
        "empty_text": b"schema\n\n   (2001-01-01)\n\n",  # a date stamp is no text
    }[kind]
    entries = [*ENTRIES[:7], bad, *ENTRIES[8:]]
    write_dictd(directory, entries)
    data = gzip.decompress((directory / "foldoc.dict.dz").read_bytes())
    at = data.index(b"\xe4") if kind == "invalid_utf8" else data.index(bad)
    return directory / "foldoc.dict.dz", data.count(b"\n", 0, at) + 1


@pytest.mark.parametrize("kind", ["invalid_utf8", "empty_text", "missing_field"])
def test_a_bad_row_fails_strict_mode_naming_file_and_line_and_is_counted_in_skip_mode(
    tmp_path: Path, kind: str
) -> None:
    path, line = _with_bad_row(kind, tmp_path / "dictd")
    with pytest.raises(BadRowError, match=rf"{path}:{line}: {kind}"):
        convert_foldoc(tmp_path / "strict", tmp_path / "dictd", SEED)
    assert not (tmp_path / "strict").exists()
    output = DatasetOutput(tmp_path / "skip", on_bad_row="skip", rejects=tmp_path / "r.jsonl")
    summary = convert_foldoc(output, tmp_path / "dictd", SEED)
    assert summary["bad_rows"]["rejected"] == {
        name: int(name == kind) for name in summary["bad_rows"]["rejected"]
    }
    assert json.loads((tmp_path / "r.jsonl").read_text())["line"] == line
    if kind == "missing_field":
        assert summary["entities"] == 9 and summary["mentions_total"] == 11
    else:  # schema is left out: Scheme's link to it is missing
        assert summary["entities"] == 8 and summary["mentions_total"] == 10
        assert summary["links"]["missing"]["no_entry"] == 4
        catalogue = EntityCatalogue.open(tmp_path / "skip")
        assert "schema" not in {e.key for e in catalogue.get_many(range(len(catalogue)))}


def test_hnce_data_foldoc_publishes_and_names_the_debian_package_when_files_are_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dictd = write_dictd(tmp_path / "dictd", ENTRIES)
    out = tmp_path / "out"
    argv = ["data", "foldoc", "--foldoc-dir", str(dictd), "--seed", str(SEED), "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "entities: 9" in printed
    assert "dev / test mentions whose gold a train mention links to: 1 / 1, not: 0 / 3" in printed
    assert json.loads((out / "summary.json").read_text())["format"] == "foldoc"
    assert main(["data", "foldoc", "--foldoc-dir", str(tmp_path), "--out", str(out)]) == 2
    assert "apt-get install dict-foldoc" in capsys.readouterr().err


REAL_FOLDOC = Path("/usr/share/dictd/foldoc.index")


@pytest.mark.slow
@pytest.mark.skipif(not REAL_FOLDOC.exists(), reason="Debian's dict-foldoc is not installed")
def test_real_foldoc_converts_with_no_bad_row_and_thousands_of_mentions_per_split(
    tmp_path: Path,
) -> None:
    summary = convert_foldoc(tmp_path / "foldoc", REAL_FOLDOC.parent)
    assert summary["bad_rows"]["rejected_total"] == 0
    assert summary["entities"] > 12_000
    assert summary["links"]["total"] > 60_000
    for split in SPLITS:
        assert summary["mentions"][split] > 3_000
    for split in ("dev", "test"):
        assert summary["seen"][split] > summary["unseen"][split] > 100
