"""The ``hnce demo`` and yardstick datasets: a subset of a converted dataset that trains in minutes.

Its evaluation split holds two kinds of held-out mention, sampled apart (the seed fixes them):

- *seen*: mentions of the source's evaluation split whose gold some mention of the subset's train
  split links to, in another context (the train split holds one of each such gold's training
  mentions, then random ones): what training on an entity's own mentions does for it;
- *unseen*: mentions whose gold no mention of the subset's train split links to (zero-shot in
  the sense of the Zeshel paper: what training generalises to entities it never saw).

Recall is reported apart for the two (:func:`hnce.cluster.compute.recall.seen_flags`). The
catalogue holds every gold, then (WordNet) every synset sharing a lemma with a gold (the ambiguous
senses, the hard distractors, held-out mentions' first), then random entities. WordNet entities and
mentions get their part of speech as ``domain`` so that the macro average is over nouns / verbs /
adjectives / adverbs; other sources keep theirs. The subset is published like every dataset
(:class:`hnce.pipeline.data.conversion.Conversion`), replacing the one an earlier run left.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from hnce.cluster.stores.tables import (
    MANIFEST_FILE,
    SPLITS,
    Entity,
    Mention,
    mention_split_path,
)
from hnce.cluster.stores.tables_read import EntityCatalogue, MentionSplit, read_summary
from hnce.pipeline.data.conversion import Conversion, DatasetOutput

CONVERTER_VERSION = 2
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
    lemma_distractors: bool,
) -> np.ndarray:
    """Entity ids of the subset, ascending: every gold, then (``lemma_distractors``) the other
    senses of the golds' lemmas (in the order of ``mentions``), then random entities, up to
    ``catalogue_entities`` (at least every gold; ``<= 0``: the whole catalogue)."""
    ordered = [gold for mention in mentions for gold in _golds(mention)]
    if lemma_distractors:
        by_lemma = entities_by_lemma(texts)
        for mention in mentions:
            for lemma in entity_lemmas(texts[mention.gold]):
                ordered.extend(by_lemma[lemma])
    ordered.extend(int(i) for i in rng.permutation(len(texts)))
    golds = {gold for mention in mentions for gold in _golds(mention)}
    limit = len(texts) if catalogue_entities <= 0 else max(catalogue_entities, len(golds))
    chosen = list(dict.fromkeys(ordered))[:limit]
    return np.sort(np.asarray(chosen, dtype=np.int64))


def _seen_and_training(
    train: list[Mention],
    held_out: list[Mention],
    seen_mentions: int,
    train_mentions: int,
    rng: np.random.Generator,
) -> tuple[list[Mention], list[Mention]]:
    """(seen held-out mentions, train split): golds drawn at random among those both
    ``held_out`` and ``train`` link to, each gold's held-out mentions taken until
    ``seen_mentions`` (at most ``train_mentions`` golds), one training mention of each, then
    random training mentions up to ``train_mentions`` (0: all)."""
    by_gold: dict[int, list[int]] = defaultdict(list)
    for row, mention in enumerate(train):
        by_gold[mention.gold].append(row)
    pool: dict[int, list[Mention]] = defaultdict(list)
    for mention in held_out:
        if mention.gold in by_gold:
            pool[mention.gold].append(mention)
    limit = train_mentions if train_mentions > 0 else len(train)
    seen: list[Mention] = []
    kept: list[int] = []
    golds = list(pool)
    for position in rng.permutation(len(golds)):
        if len(seen) >= seen_mentions or len(kept) >= limit:
            break
        gold = golds[position]
        seen.extend(pool[gold][: seen_mentions - len(seen)])
        kept.append(int(rng.choice(by_gold[gold])))
    rest = np.setdiff1d(np.arange(len(train)), kept)
    extra = rng.permutation(rest)[: max(limit - len(kept), 0)]
    rows = sorted({*kept, *(int(r) for r in extra)})
    return seen, [train[row] for row in rows]


def _unseen(
    train: list[Mention], held_out: list[Mention], count: int, rng: np.random.Generator
) -> list[Mention]:
    """``count`` held-out mentions (0: all) none of whose golds a ``train`` mention links to."""
    linked = {gold for mention in train for gold in _golds(mention)}
    pool = [m for m in held_out if not linked.intersection(_golds(m))]
    return _sample(pool, count, rng)


def write_demo_subset(
    source: Path,
    out: Path,
    catalogue_entities: int,
    train_mentions: int,
    unseen_mentions: int,
    eval_split: str,
    seed: int = 0,
    seen_mentions: int = 0,
) -> dict[str, int]:
    """Publish the subset ``out`` of the converted dataset ``source``; returns its counts."""
    rng = np.random.default_rng(seed)
    source = Path(source)
    catalogue = EntityCatalogue.open(source)
    keys = catalogue.keys().to_pylist()
    texts = catalogue.texts().to_pylist()
    titles = catalogue.titles().to_pylist()
    domains = catalogue.domain_of().to_pylist()
    wordnet = read_summary(source).get("format") == "wordnet"
    train = MentionSplit.open(mention_split_path(source, "train")).read_all()
    held_out = MentionSplit.open(mention_split_path(source, eval_split)).read_all()
    seen, train_split = _seen_and_training(train, held_out, seen_mentions, train_mentions, rng)
    unseen = _unseen(train_split, held_out, unseen_mentions, rng)
    chosen_ids = {m.mention_id for m in (*seen, *unseen)}
    splits = {
        "train": train_split,
        eval_split: [m for m in held_out if m.mention_id in chosen_ids],
    }
    old_ids = _choose_entities(
        texts, [*splits[eval_split], *splits["train"]], catalogue_entities, rng, wordnet
    )
    new_id = {int(old): new for new, old in enumerate(old_ids)}

    def domain(old: int, given: str) -> str:
        return PART_OF_SPEECH[keys[old][0]] if wordnet else given

    inputs = [("source dataset", source / MANIFEST_FILE)]
    output = DatasetOutput(Path(out), overwrite=True)
    with Conversion(output, "demo-subset", CONVERTER_VERSION, inputs) as conversion:
        with conversion.builder.entities() as writer:
            for old in old_ids:
                entity = Entity(
                    new_id[int(old)], keys[old], titles[old], texts[old], domain(old, domains[old])
                )
                writer.write(entity)
        for split in SPLITS:
            with conversion.builder.mentions(split) as mention_writer:
                for mention in splits.get(split, []):
                    mention_writer.write(
                        replace(
                            mention,
                            gold=new_id[int(mention.gold)],
                            golds=tuple(new_id[g] for g in _golds(mention)),
                            domain=domain(mention.gold, mention.domain),
                        )
                    )
        counts = {
            "entities": len(old_ids),
            "train_mentions": len(splits["train"]),
            "seen_eval_mentions": len(seen),
            "unseen_eval_mentions": len(unseen),
        }
        conversion.publish({"format": "demo-subset", "source": str(source), "seed": seed, **counts})
    return counts
