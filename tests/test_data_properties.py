"""Property: every converter, fed random bytes and random JSON lines in skip mode, never crashes
(an empty catalogue is the one clean error), and accounts for every row: per input file, the
rows read equal the rows kept plus the rows rejected."""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hnce.cluster.stores.tables import MANIFEST_FILE, REJECTS_FILE
from hnce.pipeline.data.conversion import DatasetOutput, EmptyCatalogueError
from hnce.pipeline.data.kilt import convert_kilt
from hnce.pipeline.data.wordnet import convert_wordnet
from hnce.pipeline.data.zeshel import convert_zeshel

KEYS = st.sampled_from(["12", " 12 ", "34", "0100", "١٠٠", "", "x", "[START_ENT]"])
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 10**20),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    KEYS,
    st.integers(0, 40),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)
IDS = st.one_of(KEYS, st.integers(0, 40), VALUES)
TEXTS = st.one_of(st.sampled_from(["", "a b c", "Zürich is a city", "x " * 30]), VALUES)
PARAGRAPHS = st.one_of(st.lists(TEXTS, max_size=4), VALUES)
SPANS = st.sampled_from(
    [
        "a [START_ENT] Zürich [END_ENT] b",
        "[START_ENT] [START_ENT] x [END_ENT]",
        "[END_ENT] y [START_ENT]",
        "no span",
        "[START_ENT]  [END_ENT]",
    ]
)
PROVENANCE = st.fixed_dictionaries({}, optional={"wikipedia_id": IDS, "title": TEXTS})
OUTPUT = st.one_of(
    st.lists(
        st.fixed_dictionaries(
            {}, optional={"answer": TEXTS, "provenance": st.lists(PROVENANCE, max_size=2)}
        ),
        max_size=2,
    ),
    VALUES,
)
META = st.fixed_dictionaries(
    {}, optional={"left_context": TEXTS, "mention": TEXTS, "right_context": TEXTS}
)


def _records(fields: dict[str, st.SearchStrategy]) -> st.SearchStrategy[bytes]:
    return st.fixed_dictionaries({}, optional=fields).map(lambda r: json.dumps(r).encode())


def _valid(fields: dict[str, st.SearchStrategy]) -> st.SearchStrategy[bytes]:
    return st.fixed_dictionaries(fields).map(lambda r: json.dumps(r).encode())


def _lines(
    records: st.SearchStrategy[bytes], valid: st.SearchStrategy[bytes]
) -> st.SearchStrategy[list[bytes]]:
    """Lines: well-formed rows, plausible records with fields of any type, random bytes, JSON
    that is not an object, lone-surrogate escapes and blank lines."""
    noise = st.one_of(
        st.binary(max_size=24).map(lambda b: b.replace(b"\n", b" ")),
        VALUES.map(lambda value: json.dumps(value).encode()),
        st.just(b'{"wikipedia_id": "\\ud800", "title": "\\udfff"}'),
        st.just(b"   "),
    )
    lines = st.lists(st.one_of(valid, records, records, noise), max_size=8)
    return st.tuples(valid, lines, st.integers(0, 8)).map(_with_one_valid_line)


def _with_one_valid_line(drawn: tuple[bytes, list[bytes], int]) -> list[bytes]:
    """At least one well-formed row, anywhere, so that most examples reach the mentions."""
    valid, lines, position = drawn
    return [*lines[:position], valid, *lines[position:]]


GOOD_KEYS = st.sampled_from(["12", " 34 ", 56, "0100"])


KNOWLEDGE_SOURCE = _lines(
    _records({"wikipedia_id": IDS, "wikipedia_title": TEXTS, "text": PARAGRAPHS}),
    _valid(
        {
            "wikipedia_id": GOOD_KEYS,
            "wikipedia_title": st.sampled_from(["Zürich", "Germany"]),
            "text": st.just(["Title\n", "Section::::A.\n", "Some text here.\n"]),
        }
    ),
)
BLINK = _lines(
    _records(
        {
            "text": TEXTS,
            "title": TEXTS,
            "idx": st.one_of(st.just("w?curid=12"), st.just("curid=34"), TEXTS),
        }
    ),
    _valid(
        {
            "text": st.just("Zürich is a city."),
            "title": st.sampled_from(["Zürich", "Germany"]),
            "idx": st.sampled_from(["w?curid=12", "w?curid=34", "w?curid=0100"]),
        }
    ),
)
AIDA = _lines(
    _records({"id": IDS, "input": st.one_of(SPANS, TEXTS), "output": OUTPUT, "meta": META}),
    _valid(
        {
            "id": st.one_of(st.text(st.characters(codec="ascii"), min_size=1), st.integers()),
            "input": st.just("a [START_ENT] Zürich [END_ENT] b"),
            "output": st.lists(
                st.fixed_dictionaries(
                    {
                        "answer": st.sampled_from(["Zürich", "Germany", "Atlantis"]),
                        "provenance": st.lists(
                            st.fixed_dictionaries({"wikipedia_id": GOOD_KEYS}), max_size=2
                        ),
                    }
                ),
                min_size=1,
                max_size=2,
            ),
        }
    ),
)
DOCUMENT_IDS = st.sampled_from(["A1", " A2", 7, "07"])
DOCUMENTS = _lines(
    _records({"document_id": IDS, "title": TEXTS, "text": TEXTS}),
    _valid({"document_id": DOCUMENT_IDS, "title": st.just("T"), "text": st.just("a b c d e")}),
)
ZESHEL_MENTIONS = _lines(
    _records(
        {
            "mention_id": IDS,
            "context_document_id": IDS,
            "label_document_id": IDS,
            "corpus": TEXTS,
            "start_index": st.one_of(st.integers(-1, 5), VALUES),
            "end_index": st.one_of(st.integers(-1, 5), VALUES),
            "text": TEXTS,
        }
    ),
    _valid(
        {
            "mention_id": IDS,
            "context_document_id": DOCUMENT_IDS,
            "label_document_id": DOCUMENT_IDS,
            "corpus": st.just("w"),
            "start_index": st.integers(0, 2),
            "end_index": st.integers(2, 5),
        }
    ),
)
WORDNET_LINES = st.tuples(
    st.just(b'02084071 05 n 02 dog 0 hound 0 000 | a dog; "the dog barked"'),
    st.lists(
        st.one_of(
            st.sampled_from(
                [
                    b"02084071 05 n 01 dog 0 000 | a duplicate synset",
                    b'00001740 00 a 01 able(a) 0 000 | having means; "abler than most"',
                    b"10 05 n 00 | no words",
                    b"10 05 n zz x 0 | not hex",
                    b"  2 licence header",
                    b"11 05 n 01 _ 0 000 | an empty lemma",
                ]
            ),
            st.binary(max_size=24).map(lambda b: b.replace(b"\n", b" ")),
            st.text(max_size=30).map(lambda t: t.replace("\n", " ").encode()),
        ),
        max_size=8,
    ),
    st.integers(0, 8),
).map(_with_one_valid_line)
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _write(path: Path, lines: list[bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def _rows_read(
    lines: list[bytes], is_row: Callable[[str], bool] = lambda s: bool(s.strip())
) -> int:
    """The lines a converter treats as rows: undecodable ones, and the non-blank others."""
    count = 0
    for line in lines:
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            count += 1
            continue
        count += is_row(text)
    return count


def _kept_and_rejected(out: Path) -> tuple[dict[str, int], Counter[str]]:
    """Rows written per Parquet file, and rejected rows per input file."""
    kept = {
        path.relative_to(out).as_posix(): pq.ParquetFile(path).metadata.num_rows
        for path in out.rglob("*.parquet")
    }
    rejected: Counter[str] = Counter()
    if (out / REJECTS_FILE).is_file():
        for line in (out / REJECTS_FILE).read_text(encoding="utf-8").split("\n")[:-1]:
            rejected[Path(json.loads(line)["file"]).name] += 1
    return kept, rejected


def _convert(convert: Callable[[DatasetOutput], object], work: Path) -> Path | None:
    out = work / "out"
    try:
        convert(DatasetOutput(out, on_bad_row="skip"))
    except EmptyCatalogueError:
        assert not out.exists()
        return None
    assert (out / MANIFEST_FILE).is_file()
    return out


@SETTINGS
@given(pages=KNOWLEDGE_SOURCE, aida=AIDA, blink=BLINK, use_blink=st.booleans())
def test_kilt_and_blink_account_for_every_row(
    pages: list[bytes], aida: list[bytes], blink: list[bytes], use_blink: bool
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        work = Path(directory)
        catalogue_lines = blink if use_blink else pages
        catalogue = _write(work / ("entity.jsonl" if use_blink else "ks.json"), catalogue_lines)
        mentions = _write(work / "aidayago2-train-kilt.jsonl", aida)
        source = {"blink_entities" if use_blink else "knowledge_source": catalogue}
        out = _convert(lambda output: convert_kilt(output, [mentions], **source), work)
        if out is None:
            return
        kept, rejected = _kept_and_rejected(out)
        entities = sum(n for name, n in kept.items() if name.startswith("entities/"))
        assert _rows_read(catalogue_lines) == entities + rejected[catalogue.name]
        assert _rows_read(aida) == kept["mentions/train.parquet"] + rejected[mentions.name]


@SETTINGS
@given(documents=DOCUMENTS, train=ZESHEL_MENTIONS, test=ZESHEL_MENTIONS)
def test_zeshel_accounts_for_every_row(
    documents: list[bytes], train: list[bytes], test: list[bytes]
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        work = Path(directory)
        _write(work / "zeshel" / "documents" / "w.json", documents)
        _write(work / "zeshel" / "mentions" / "train.json", train)
        _write(work / "zeshel" / "mentions" / "test.json", test)
        out = _convert(lambda output: convert_zeshel(work / "zeshel", output), work)
        if out is None:
            return
        kept, rejected = _kept_and_rejected(out)
        assert _rows_read(documents) == kept["entities/part-00000.parquet"] + rejected["w.json"]
        assert _rows_read(train) == kept["mentions/train.parquet"] + rejected["train.json"]
        assert _rows_read(test) == kept["mentions/test.parquet"] + rejected["test.json"]


@SETTINGS
@given(nouns=WORDNET_LINES)
def test_wordnet_accounts_for_every_row(nouns: list[bytes]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        work = Path(directory)
        wordnet = work / "wordnet"
        _write(wordnet / "data.noun", nouns)
        for name in ("verb", "adj", "adv"):
            _write(wordnet / f"data.{name}", [])
        out = _convert(lambda output: convert_wordnet(output, wordnet), work)
        if out is None:
            return
        kept, rejected = _kept_and_rejected(out)
        is_row = lambda text: bool(text.strip()) and not text.startswith("  ")  # noqa: E731
        assert (
            _rows_read(nouns, is_row) == kept["entities/part-00000.parquet"] + rejected["data.noun"]
        )
