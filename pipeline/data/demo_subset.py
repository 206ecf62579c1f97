"""The ``hnce demo`` dataset: a subset of the converted WordNet dataset that trains in minutes.

Sampled train and held-out mentions, and a catalogue of every synset sharing a lemma with their
golds (the ambiguous senses, held-out mentions' first: they are the distractors the evaluation is
about), topped up with random synsets. Entities and mentions get their part of speech as
``domain`` so that the macro average is over nouns / verbs / adjectives / adverbs. The subset is
published like every dataset (:class:`hnce.pipeline.data.conversion.Conversion`), replacing the one
an earlier demo run left.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from hnce.cluster.stores.tables import MANIFEST_FILE, SPLITS, Entity, Mention, mention_split_path
from hnce.cluster.stores.tables_read import EntityCatalogue, MentionSplit
from hnce.pipeline.data.conversion import Conversion, DatasetOutput

CONVERTER_VERSION = 1
PART_OF_SPEECH = {"n": "noun", "v": "verb", "a": "adjective", "r": "adverb"}


def entity_lemmas(text: str) -> list[str]:
    """The lemmas of a WordNet entity text ``"lemma, lemma: definition"`` (lower case)."""
    head = text.split(": ", 1)[0]
    return [lemma.strip().lower() for lemma in head.split(",") if lemma.strip()]


def entities_by_lemma(texts: Sequence[str]) -> dict[str, list[int]]:
    """Each lemma (lower case) -> the ids of the entities whose text ``texts[id]`` lists it."""
    by_lemma: dict[str, list[int]] = defaultdict(list)
    for entity_id, text in enumerate(texts):
        for lemma in entity_lemmas(text):
            by_lemma[lemma].append(entity_id)
    return by_lemma


def _sample(mentions: list[Mention], count: int, rng: np.random.Generator) -> list[Mention]:
    if count <= 0 or count >= len(mentions):
        return mentions
    chosen = np.sort(rng.choice(len(mentions), size=count, replace=False))
    return [mentions[i] for i in chosen]


def _golds(mention: Mention) -> list[int]:
    return [int(g) for g in (mention.golds or (mention.gold,))]


def _choose_entities(
    texts: Sequence[str],
    mentions: Sequence[Mention],
    catalogue_entities: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Entity ids of the subset, ascending: every gold, then the other senses of the golds'
    lemmas (in the order of ``mentions``), then random synsets, up to ``catalogue_entities``
    (at least every gold; ``<= 0``: the whole catalogue)."""
    by_lemma = entities_by_lemma(texts)
    ordered = [gold for mention in mentions for gold in _golds(mention)]
    for mention in mentions:
        for lemma in entity_lemmas(texts[mention.gold]):
            ordered.extend(by_lemma[lemma])
    ordered.extend(int(i) for i in rng.permutation(len(texts)))
    golds = {gold for mention in mentions for gold in _golds(mention)}
    limit = len(texts) if catalogue_entities <= 0 else max(catalogue_entities, len(golds))
    chosen = list(dict.fromkeys(ordered))[:limit]
    return np.sort(np.asarray(chosen, dtype=np.int64))


def write_demo_subset(
    source: Path,
    out: Path,
    catalogue_entities: int,
    train_mentions: int,
    eval_mentions: int,
    eval_split: str,
    seed: int = 0,
) -> dict[str, int]:
    """Publish the demo dataset ``out`` from the converted WordNet ``source``; returns counts."""
    rng = np.random.default_rng(seed)
    catalogue = EntityCatalogue.open(source)
    keys = catalogue.keys().to_pylist()
    texts = catalogue.texts().to_pylist()
    titles = catalogue.titles().to_pylist()
    splits = {
        "train": _sample(
            MentionSplit.open(mention_split_path(source, "train")).read_all(), train_mentions, rng
        ),
        eval_split: _sample(
            MentionSplit.open(mention_split_path(source, eval_split)).read_all(), eval_mentions, rng
        ),
    }
    old_ids = _choose_entities(
        texts, [*splits[eval_split], *splits["train"]], catalogue_entities, rng
    )
    new_id = {int(old): new for new, old in enumerate(old_ids)}
    inputs = [("source dataset", Path(source) / MANIFEST_FILE)]
    output = DatasetOutput(Path(out), overwrite=True)
    with Conversion(output, "wordnet-demo", CONVERTER_VERSION, inputs) as conversion:
        with conversion.builder.entities() as writer:
            for old in old_ids:
                domain = PART_OF_SPEECH[keys[old][0]]
                writer.write(Entity(new_id[int(old)], keys[old], titles[old], texts[old], domain))
        for split in SPLITS:
            with conversion.builder.mentions(split) as mention_writer:
                for mention in splits.get(split, []):
                    mention_writer.write(
                        replace(
                            mention,
                            gold=new_id[int(mention.gold)],
                            golds=tuple(new_id[g] for g in _golds(mention)),
                            domain=PART_OF_SPEECH[keys[mention.gold][0]],
                        )
                    )
        counts = {
            "entities": len(old_ids),
            "train_mentions": len(splits["train"]),
            "eval_mentions": len(splits[eval_split]),
        }
        conversion.publish(
            {"format": "wordnet-demo", "source": str(source), "seed": seed, **counts}
        )
    return counts
