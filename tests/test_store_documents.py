"""Content checks behind the checksums: every JSON document hnce reads back
is read against its schema. Cut short, with a value of the wrong type or without a key it
needs, a document is an InputError naming the file (one line, exit 2 at the command line),
never a JSONDecodeError, KeyError, TypeError or a wrong value used later; a record of work that
can be done again (a build's progress, a generator's record) is instead dropped with a warning
naming the file, and the work is done again.

Each artifact is written the real way (an export, a checkpoint, a lock, a conversion, a build
that died), except Ray Train's checkpoint pointer, written as rank 0 writes it."""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import ray.train
from conftest import LETTER_PIECES, tiny_bert_config, write_wordpiece_tokenizer
from store_helpers import write_checkpoint

from hnce.cluster.compute.lock import RunLock
from hnce.cluster.stores import tokens
from hnce.cluster.stores.checkpoints import COMPLETE, STATE_FILE, verify_checkpoint, wants_refresh
from hnce.cluster.stores.files import PROGRESS_FILE, sha256_file
from hnce.cluster.stores.lock_holder import REFRESH, holder_file, read_holder
from hnce.cluster.stores.tables import MANIFEST_FILE, SUMMARY_FILE, Entity
from hnce.cluster.stores.tables_read import read_summary
from hnce.cluster.stores.tables_write import write_dataset
from hnce.cluster.stores.tokens import TOKENS_DIR, TokenStore
from hnce.encoders.biencoder import SCORER_FILE, build_biencoder, export_biencoder, load_biencoder
from hnce.encoders.reranker import RERANKER_FILE, build_reranker, export_reranker, load_reranker
from hnce.errors import InputError
from hnce.pipeline.data.kilt_synthetic import GENERATOR_FILE, PARTS_DIR, generate_kilt_inputs
from hnce.pipeline.data.synthetic import generate_synthetic_dataset
from hnce.pipeline.train import checkpointing

Edit = Callable[[str], str]


def truncated(text: str) -> str:
    return text[: len(text) // 2]


def setting(keys: tuple[str, ...], value: object) -> Edit:
    """The document with ``value`` at the key path ``keys`` (a hand edit of one value)."""

    def edit(text: str) -> str:
        document = json.loads(text)
        *parents, last = keys
        inner = document
        for key in parents:
            inner = inner[key]
        inner[last] = value
        return json.dumps(document)

    return edit


def without(key: str) -> Edit:
    """The document without its top-level ``key``."""
    return lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != key})


def replaced_by(value: object) -> Edit:
    """Another JSON value where the document's object was."""
    return lambda _: json.dumps(value)


@dataclass(frozen=True)
class Document:
    """A JSON file written the real way, how a command loads it, and how to re-sign it after an
    edit where a manifest lists it (whoever edits the file can edit the manifest too)."""

    file: Path
    load: Callable[[], object]
    resign: Callable[[], None] = lambda: None


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    return write_wordpiece_tokenizer(tmp_path_factory.mktemp("vocab"), LETTER_PIECES)


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> dict[str, Path]:
    """A tiny bi-encoder's and a tiny reranker's export directories (copied before an edit)."""
    root = tmp_path_factory.mktemp("exports")
    config = tiny_bert_config(len(tokenizer))
    export_biencoder(build_biencoder(config, "dual", tokenizer=tokenizer), root / "biencoder")
    export_reranker(build_reranker(config, tokenizer), root / "reranker")
    return {"biencoder": root / "biencoder", "reranker": root / "reranker"}


def _training_state(tmp_path: Path, request: pytest.FixtureRequest) -> Document:
    directory = write_checkpoint(tmp_path, 5, refresh=False)
    return Document(directory / STATE_FILE, lambda: wants_refresh(directory))


def _checkpoint_manifest(tmp_path: Path, request: pytest.FixtureRequest) -> Document:
    directory = write_checkpoint(tmp_path, 5)
    return Document(directory / COMPLETE, lambda: verify_checkpoint(directory))


def _checkpoint_pointer(tmp_path: Path, request: pytest.FixtureRequest) -> Document:
    """What rank 0 attaches to its report; a restarted worker group reads it back from Ray
    Train's checkpoint storage."""
    path = tmp_path / checkpointing.POINTER_FILE
    path.write_text(json.dumps({"step": 5}))
    reported = ray.train.Checkpoint.from_directory(str(tmp_path))
    request.getfixturevalue("monkeypatch").setattr(ray.train, "get_checkpoint", lambda: reported)
    return Document(path, checkpointing.reported_checkpoint_step)


def _export(kind: str, file: str, load: Callable[[Path], object]):
    def document(tmp_path: Path, request: pytest.FixtureRequest) -> Document:
        export = shutil.copytree(request.getfixturevalue("exports")[kind], tmp_path / kind)
        return Document(export / file, lambda: load(export))

    return document


def _lock_holder(tmp_path: Path, request: pytest.FixtureRequest) -> Document:
    """The record a holder leaves behind when it is killed (this process: alive)."""
    path = tmp_path / holder_file(REFRESH)
    with RunLock(tmp_path, "tests"):
        record = path.read_text()
    path.write_text(record)
    return Document(path, lambda: read_holder(tmp_path))


def _dataset_summary(schema: Callable[[], Any] | None = None):
    """A synthetic dataset's summary, read as the store reads any dataset's, or with a
    conversion's schema (``schema``: imported when loading) as the BLINK recipe reads it."""

    def document(tmp_path: Path, request: pytest.FixtureRequest) -> Document:
        root = tmp_path / "data"
        generate_synthetic_dataset(root, 2, 5, 1)
        manifest = root / MANIFEST_FILE

        def resign() -> None:
            payload = json.loads(manifest.read_text())
            payload["files"][SUMMARY_FILE] = {
                "bytes": (root / SUMMARY_FILE).stat().st_size,
                "sha256": sha256_file(root / SUMMARY_FILE),
            }
            manifest.write_text(json.dumps(payload))

        def load() -> object:
            return read_summary(root) if schema is None else read_summary(root, schema())

        return Document(root / SUMMARY_FILE, load, resign)

    return document


def _conversion_summary_schema() -> Any:
    from hnce.pipeline.data.conversion import CONVERSION_SUMMARY

    return CONVERSION_SUMMARY


REFUSED = {
    "training state": _training_state,
    "checkpoint manifest": _checkpoint_manifest,
    "checkpoint pointer": _checkpoint_pointer,
    "export description": _export("biencoder", SCORER_FILE, load_biencoder),
    "reranker description": _export("reranker", RERANKER_FILE, load_reranker),
    "lock holder": _lock_holder,
    "dataset summary": _dataset_summary(),
    "conversion summary": _dataset_summary(_conversion_summary_schema),
}
# (document, edit): only the edits that were not already refused, naming the file, before
# these checks (a truncated COMPLETE or lock record, say, already was)
REFUSED_CASES = {
    "training state truncated": ("training state", truncated),
    "training state refresh not a bool": ("training state", setting(("refresh",), "no")),
    "training state without step": ("training state", without("step")),
    "checkpoint manifest step not an int": ("checkpoint manifest", setting(("step",), "5")),
    "checkpoint manifest without step": ("checkpoint manifest", without("step")),
    "checkpoint pointer truncated": ("checkpoint pointer", truncated),
    "checkpoint pointer step not an int": ("checkpoint pointer", setting(("step",), "5")),
    "checkpoint pointer without step": ("checkpoint pointer", without("step")),
    "export description truncated": ("export description", truncated),
    "export description pooling not a name": ("export description", setting(("pooling",), 3)),
    "export description scorer m not an int": (
        "export description",
        setting(("scorer", "m"), "1"),
    ),
    "export description without mention_length": (
        "export description",
        without("mention_length"),
    ),
    "reranker description truncated": ("reranker description", truncated),
    "reranker description max_length not an int": (
        "reranker description",
        setting(("max_length",), "long"),
    ),
    "reranker description without mention_length": (
        "reranker description",
        without("mention_length"),
    ),
    "lock holder pid not an int": ("lock holder", setting(("pid",), "1")),
    "dataset summary truncated": ("dataset summary", truncated),
    "dataset summary not an object": ("dataset summary", replaced_by(["entities", 10])),
    "conversion summary without bad_rows": ("conversion summary", without("bad_rows")),
}


@pytest.mark.parametrize("case", REFUSED_CASES)
def test_a_broken_document_is_an_input_error_naming_its_file(
    case: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    name, edit = REFUSED_CASES[case]
    document = REFUSED[name](tmp_path, request)
    document.load()  # as written, it loads
    document.file.write_text(edit(document.file.read_text()))
    document.resign()
    with pytest.raises(InputError, match=re.escape(str(document.file))):
        document.load()


class _DiesAtCall:
    """``function``, raising on its ``dies_at``-th call instead (a build killed mid-way)."""

    def __init__(self, function: Callable[..., Any], dies_at: int) -> None:
        self.function, self.dies_at, self.calls = function, dies_at, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == self.dies_at:
            raise OSError("planted: the build dies here")
        return self.function(*args, **kwargs)


Redo = Callable[[], None]


def _token_progress(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Path, Redo]:
    """A token store build that died after recording 16 of 40 rows; the next build reads its
    progress (and must end with every row)."""
    tokenizer = request.getfixturevalue("tokenizer")
    monkeypatch = request.getfixturevalue("monkeypatch")
    root = tmp_path / "data"
    write_dataset(root, [Entity(i, f"k{i}", "ab"[i % 2], "text") for i in range(40)])
    monkeypatch.setattr(tokens, "_BUILD_BATCH", 8)
    monkeypatch.setattr(tokens, "_BATCHES_PER_PROGRESS", 1)
    real = tokens.tokenize_entities
    monkeypatch.setattr(tokens, "tokenize_entities", _DiesAtCall(real, dies_at=3))
    with pytest.raises(OSError, match="planted"):
        TokenStore.ensure(root, tokenizer, 8)
    monkeypatch.setattr(tokens, "tokenize_entities", real)
    (progress,) = (root / TOKENS_DIR).glob(f".*/{PROGRESS_FILE}")

    def redo() -> None:
        assert len(TokenStore.ensure(root, tokenizer, 8)) == 40

    return progress, redo


def _generate(out: Path) -> dict[str, Any]:
    return generate_kilt_inputs(out, pages=40, mentions={"train": 2}, part_lines=16)


def _generator_record(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Path, Redo]:
    """``generator.json`` of a finished generation; generating again with the same parameters
    reads it (and must return what the files are)."""
    finished = _generate(tmp_path)

    def redo() -> None:
        assert _generate(tmp_path)["files"] == finished["files"]
        assert json.loads((tmp_path / GENERATOR_FILE).read_text())["files"] == finished["files"]

    return tmp_path / GENERATOR_FILE, redo


def _parts_stamp(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Path, Redo]:
    """The stamp an interrupted generation leaves with its parts (the parameters, as the
    generator writes them before any part); generating again reads it."""
    finished = _generate(tmp_path)
    (tmp_path / GENERATOR_FILE).unlink()
    stamp = tmp_path / PARTS_DIR / GENERATOR_FILE
    stamp.parent.mkdir()
    stamp.write_text(json.dumps(finished["parameters"], indent=2, sort_keys=True))

    def redo() -> None:
        assert _generate(tmp_path)["files"] == finished["files"]

    return stamp, redo


RESUMABLE = {
    "token store progress": _token_progress,
    "generator record": _generator_record,
    "parts stamp": _parts_stamp,
}
# (record, edit): again only the edits that were not already started again from before
RESUMABLE_CASES = {
    "token store progress rows_done not an int": (
        "token store progress",
        setting(("rows_done",), "many"),
    ),
    "token store progress without rows_done": ("token store progress", without("rows_done")),
    "generator record truncated": ("generator record", truncated),
    "generator record bytes not an int": (
        "generator record",
        setting(("files", "kilt_knowledgesource.json", "bytes"), "big"),
    ),
    "generator record without parameters": ("generator record", without("parameters")),
    "parts stamp truncated": ("parts stamp", truncated),
}


@pytest.mark.parametrize("case", RESUMABLE_CASES)
def test_a_broken_record_of_resumable_work_is_named_and_the_work_done_again(
    case: str, tmp_path: Path, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    name, edit = RESUMABLE_CASES[case]
    record, redo = RESUMABLE[name](tmp_path, request)
    record.write_text(edit(record.read_text()))
    with caplog.at_level(logging.WARNING):
        redo()
    assert any(str(record) in message for message in caplog.messages)
