"""The settings surface: docs/settings.md is generated from the tree and current, every key is
described beside its declaration and named once, and the tree stays small enough to hold."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from pathlib import Path

from hnce.pipeline.config import Config
from hnce.pipeline.config.reference import attribute_descriptions, leaves, render_reference
from hnce.pipeline.config.sections import RerankTrainingSettings

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "settings.md"
REGENERATE = ".venv/bin/python -m hnce.pipeline.config.reference docs/settings.md"

#: The most leaf keys the tree may have (issue 66): each moves a measured figure or fits a
#: deployment; a key no user would set is a constant with its reason, or computed.
MAX_LEAF_KEYS = 110
RERANKER_OWN = [field.name for field in dataclasses.fields(RerankTrainingSettings)]


def test_docs_settings_md_is_what_the_tree_generates() -> None:
    assert REFERENCE.read_text() == render_reference(), f"docs/settings.md is stale: {REGENERATE}"


def test_every_key_is_described_once_beside_its_declaration() -> None:
    undescribed = [leaf.key for leaf in leaves() if not leaf.description]
    assert not undescribed, f"add them to their section's Attributes: block: {undescribed}"
    text = REFERENCE.read_text()
    for leaf in leaves():
        assert text.count(f"| `{leaf.key}` |") == 1, leaf.key


def test_no_two_keys_share_a_name_for_different_things() -> None:
    """A leaf name means one thing: the loss's ``temperature`` is not the hard sampler's
    ``sampling_temperature``, nor the schedule's ``sampling_temperature_by_step``."""
    keys_of = defaultdict(set)
    for leaf in leaves():
        keys_of[leaf.key.rsplit(".", 1)[-1]].add(leaf.key)
    one_meaning = [  # the same setting in two places
        *({f"training.{name}", f"rerank.training.{name}"} for name in RERANKER_OWN),
        {"refresh.enabled", "negatives.cache.enabled"},  # whether that part runs
        {"refresh.top_n", "negatives.lexical.top_n"},  # candidates a search keeps per mention
        {"loss.name", "model.scorer.name"},  # which registered one the section configures
    ]
    shared = {
        name: sorted(keys)
        for name, keys in keys_of.items()
        if len(keys) > 1 and keys not in one_meaning
    }
    assert not shared, shared


def test_the_tree_has_at_most_110_leaf_keys() -> None:
    count = len(list(leaves()))
    assert count <= MAX_LEAF_KEYS, f"{count} leaf keys, more than {MAX_LEAF_KEYS}"


def test_an_attributes_block_is_read_entry_by_entry() -> None:
    class Section:
        """Summary.

        Attributes:
            first: one line.
            second (int): two
                lines.

        Not an attribute: after the block.
        """

    assert attribute_descriptions(Section) == {"first": "one line.", "second": "two lines."}
    assert attribute_descriptions(Config) == {}
