"""The token store: rows equal a fresh tokenization, keyed by tokenizer and length, checked,
and a build that died resumes where it recorded its progress."""

from __future__ import annotations

import json
import shutil
import string
from pathlib import Path

import numpy as np
import pytest
from conftest import LETTER_PIECES, write_wordpiece_tokenizer
from store_helpers import flip_byte

from hnce.cluster.stores import tokens
from hnce.cluster.stores.tables import Entity
from hnce.cluster.stores.tables_write import write_dataset
from hnce.cluster.stores.tokens import MANIFEST_FILE, TOKENS_DIR, TokenStore, TokenStoreError
from hnce.encoders.formatting import register_markers, tokenize_entities
from hnce.errors import InputError

LETTERS = list(string.ascii_lowercase)


def _catalogue(root: Path, count: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)

    def word() -> str:
        return "".join(rng.choice(LETTERS, size=int(rng.integers(1, 8))))

    entities = [
        Entity(i, f"k{i}", word(), " ".join(word() for _ in range(int(rng.integers(0, 30)))))
        for i in range(count)
    ]
    write_dataset(root, entities, rows_per_file=40, overwrite=True)
    return root


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    directory = tmp_path_factory.mktemp("vocab")
    tokenizer = write_wordpiece_tokenizer(directory, LETTER_PIECES)
    register_markers(tokenizer)
    return tokenizer


def test_rows_equal_a_fresh_tokenization(tmp_path: Path, tokenizer) -> None:
    root = _catalogue(tmp_path / "data", 100)
    store = TokenStore.ensure(root, tokenizer, 16)
    assert len(store) == 100 and store.ids.dtype == np.uint16
    from hnce.cluster.stores.tables_read import EntityCatalogue

    catalogue = EntityCatalogue.open(root)
    picked = np.array([97, 3, 3, 50, 0])
    entities = catalogue.get_many(picked.tolist())
    fresh = tokenize_entities(
        tokenizer, [e.title for e in entities], [e.text for e in entities], 16
    )
    batch = store.batch(picked)
    assert batch["input_ids"].tolist() == fresh["input_ids"].tolist()
    assert batch["attention_mask"].tolist() == fresh["attention_mask"].tolist()
    # a second call reuses the published store
    assert TokenStore.ensure(root, tokenizer, 16).directory == store.directory


def test_a_new_length_or_tokenizer_gets_its_own_store(tmp_path: Path, tokenizer) -> None:
    root = _catalogue(tmp_path / "data", 30)
    first = TokenStore.ensure(root, tokenizer, 16)
    longer = TokenStore.ensure(root, tokenizer, 24)
    other_tokenizer = write_wordpiece_tokenizer(tmp_path / "other", LETTERS)
    register_markers(other_tokenizer)
    other = TokenStore.ensure(root, other_tokenizer, 16)
    assert len({first.directory, longer.directory, other.directory}) == 3
    assert sorted(p.name for p in (root / TOKENS_DIR).iterdir() if p.is_dir()) == sorted(
        s.directory.name for s in (first, longer, other)
    )


def test_changed_catalogue_and_corrupt_arrays_are_refused(tmp_path: Path, tokenizer) -> None:
    root = _catalogue(tmp_path / "data", 30)
    store = TokenStore.ensure(root, tokenizer, 16)
    # a new catalogue is published over the old dataset (which takes its tokens/ along), and the
    # old store is put back by hand
    old_tokens = shutil.move(root / TOKENS_DIR, tmp_path / "old-tokens")
    _catalogue(root, 30, seed=1)
    shutil.move(old_tokens, root / TOKENS_DIR)
    with pytest.raises(TokenStoreError, match="built for catalogue"):
        TokenStore.ensure(root, tokenizer, 16)
    ids = store.directory / "ids.npy"
    flip_byte(ids, -1)
    with pytest.raises(TokenStoreError, match=r"ids\.npy: sha256"):
        TokenStore.open(store.directory)


def test_a_truncated_or_hand_edited_manifest_is_named(tmp_path: Path, tokenizer) -> None:
    """The manifest is read against its schema before any array is mapped: cut short, it is an
    error naming the file and line; with a value of the wrong type or a key it does not have,
    naming the key (an InputError, exit 2, never a JSONDecodeError or a KeyError)."""
    store = TokenStore.ensure(_catalogue(tmp_path / "data", 30), tokenizer, 16)
    path = store.directory / MANIFEST_FILE
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(InputError, match=rf"{path}:\d+: invalid manifest JSON"):
        TokenStore.open(store.directory)
    manifest = json.loads(text)
    path.write_text(json.dumps({**manifest, "rows": "thirty"}))
    with pytest.raises(InputError, match=rf"{path}: not a valid manifest: rows"):
        TokenStore.open(store.directory)
    path.write_text(json.dumps({key: value for key, value in manifest.items() if key != "pad_id"}))
    with pytest.raises(InputError, match="pad_id: Field required"):
        TokenStore.open(store.directory)


class _DiesAtBatch:
    """``tokenize_entities`` that counts the rows it tokenizes and raises on batch ``dies_at``."""

    def __init__(self, dies_at: int | None = None) -> None:
        self.dies_at, self.batches, self.rows = dies_at, 0, 0

    def __call__(self, tokenizer, titles, texts, *args, **kwargs):
        self.batches += 1
        if self.batches == self.dies_at:
            raise OSError("planted: killed mid-build")
        self.rows += len(titles)
        return tokenize_entities(tokenizer, titles, texts, *args, **kwargs)


def _arrays(store: TokenStore) -> list[list[int]]:
    return [np.asarray(getattr(store, name)).ravel().tolist() for name in tokens.ARRAYS]


def test_a_build_that_died_resumes_at_its_recorded_row(
    tmp_path: Path, tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches of 16 in files of 40 rows (16, 16, 8 a file), progress every 2 batches: dying in
    batch 6 leaves row 56 recorded (batch 4's end), and the next build tokenizes only rows
    56..199, into arrays and checksums equal to an uninterrupted build's. A catalogue changed
    in between is tokenized again from row 0."""
    monkeypatch.setattr(tokens, "_BUILD_BATCH", 16)
    monkeypatch.setattr(tokens, "_BATCHES_PER_PROGRESS", 2)
    uninterrupted = TokenStore.ensure(_catalogue(tmp_path / "reference", 200), tokenizer, 16)
    root = _catalogue(tmp_path / "data", 200)
    monkeypatch.setattr(tokens, "tokenize_entities", _DiesAtBatch(dies_at=6))
    with pytest.raises(OSError, match="planted"):
        TokenStore.ensure(root, tokenizer, 16)
    resumed = _DiesAtBatch()
    monkeypatch.setattr(tokens, "tokenize_entities", resumed)
    store = TokenStore.ensure(root, tokenizer, 16)
    assert resumed.rows == 200 - 56
    assert store.manifest["sha256"] == uninterrupted.manifest["sha256"]
    assert _arrays(store) == _arrays(uninterrupted)
    assert sorted(entry.name for entry in (root / TOKENS_DIR).iterdir()) == [
        store.directory.name,
        store.directory.name + ".lock",
    ]

    changed = _catalogue(tmp_path / "changed", 200)
    monkeypatch.setattr(tokens, "tokenize_entities", _DiesAtBatch(dies_at=6))
    with pytest.raises(OSError, match="planted"):
        TokenStore.ensure(changed, tokenizer, 16)
    unfinished = shutil.move(changed / TOKENS_DIR, tmp_path / "unfinished")
    _catalogue(changed, 200, seed=1)  # a new catalogue in place; its tokens/ put back by hand
    shutil.move(unfinished, changed / TOKENS_DIR)
    again = _DiesAtBatch()
    monkeypatch.setattr(tokens, "tokenize_entities", again)
    store = TokenStore.ensure(changed, tokenizer, 16)
    assert again.rows == 200
    fresh = TokenStore.ensure(_catalogue(tmp_path / "fresh", 200, seed=1), tokenizer, 16)
    assert _arrays(store) == _arrays(fresh)
