"""Synthetic Zeshel-like worlds and the thin `hnce data` command."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from hnce.cluster.stores.tables import mention_split_path
from hnce.cluster.stores.tables_read import EntityCatalogue, MentionSplit, read_summary
from hnce.pipeline.cli.main import main
from hnce.pipeline.data.synthetic import generate_synthetic_dataset


def _all_mentions(root: Path) -> list:
    return [
        m
        for split in ("train", "dev", "test")
        for m in MentionSplit.open(mention_split_path(root, split)).read_all()
    ]


def test_each_world_is_a_domain_and_whole_worlds_make_the_splits(tmp_path: Path) -> None:
    summary = generate_synthetic_dataset(
        tmp_path, num_worlds=4, entities_per_world=30, mentions_per_entity=3, seed=7
    )
    catalogue = EntityCatalogue.open(tmp_path)
    assert len(catalogue) == summary["entities"] == 120
    assert catalogue.domains() == ["world_00", "world_01", "world_02", "world_03"]
    assert summary["mentions"] == {"train": 180, "dev": 90, "test": 90}
    for split, worlds in (
        ("train", ["world_00", "world_01"]),
        ("dev", ["world_02"]),
        ("test", ["world_03"]),
    ):
        assert MentionSplit.open(mention_split_path(tmp_path, split)).domains() == worlds
    for mention in _all_mentions(tmp_path):
        assert catalogue.get(mention.gold).domain == mention.domain


def test_names_share_tokens_so_string_matching_is_not_enough(tmp_path: Path) -> None:
    generate_synthetic_dataset(
        tmp_path, num_worlds=1, entities_per_world=50, mentions_per_entity=4, seed=0
    )
    catalogue = EntityCatalogue.open(tmp_path)
    token_counts = Counter(
        token for title in catalogue.titles().to_pylist() for token in title.split()
    )
    assert max(token_counts.values()) >= 5
    ambiguous = [
        m
        for m in _all_mentions(tmp_path)
        if token_counts[m.mention.split()[0]] > 1 and len(m.mention.split()) == 1
    ]
    assert len(ambiguous) > 100
    titles = catalogue.titles().to_pylist()
    for mention in _all_mentions(tmp_path):
        assert set(mention.mention.split()) <= set(titles[mention.gold].split())


def test_the_same_seed_gives_the_same_mentions_and_another_seed_others(tmp_path: Path) -> None:
    a = generate_synthetic_dataset(tmp_path / "a", 2, 10, 2, seed=3)
    b = generate_synthetic_dataset(tmp_path / "b", 2, 10, 2, seed=3)
    c = generate_synthetic_dataset(tmp_path / "c", 2, 10, 2, seed=4)
    assert a["mentions"] == b["mentions"]
    assert _all_mentions(tmp_path / "a") == _all_mentions(tmp_path / "b")
    assert _all_mentions(tmp_path / "a") != _all_mentions(tmp_path / "c")
    assert sum(c["mentions"].values()) == 40


def test_cli_data_synthetic_and_skip_mode(tmp_path: Path, capsys) -> None:
    out = tmp_path / "synthetic"
    assert (
        main(["data", "synthetic", "--worlds", "3", "--entities-per-world", "5", "--out", str(out)])
        == 0
    )
    printed = capsys.readouterr().out
    assert "entities: 15" in printed
    assert read_summary(out)["format"] == "synthetic"
    zeshel = tmp_path / "zeshel"
    (zeshel / "documents").mkdir(parents=True)
    (zeshel / "mentions").mkdir()
    (zeshel / "documents" / "w.json").write_text(
        json.dumps({"document_id": "d", "title": "T", "text": "a b"}) + "\n{oops\n",
        encoding="utf-8",
    )
    out = tmp_path / "zeshel-out"
    assert main(["data", "zeshel", str(zeshel), "--out", str(out), "--on-bad-row", "skip"]) == 0
    assert "rejected rows: 1 {'malformed_json': 1}" in capsys.readouterr().out
    assert json.loads((out / "rejects.jsonl").read_text())["line"] == 2


def test_data_verify_passes_an_intact_dataset_and_names_a_changed_file(
    tmp_path: Path, capsys
) -> None:
    out = tmp_path / "synthetic"
    assert (
        main(["data", "synthetic", "--worlds", "3", "--entities-per-world", "5", "--out", str(out)])
        == 0
    )
    assert main(["data", "verify", str(out)]) == 0
    assert "files match" in capsys.readouterr().out
    summary = out / "summary.json"
    payload = bytearray(summary.read_bytes())
    payload[5] ^= 0x01  # same size: only the SHA-256 tells
    summary.write_bytes(bytes(payload))
    assert main(["data", "verify", str(out)]) == 2
    assert f"{summary}: sha256" in capsys.readouterr().err
