"""Seeded synthetic Zeshel-like worlds where string matching is not enough.

Each world has its own made-up vocabulary. Entity names are two tokens drawn from small per-world
pools, so every name token is shared by several entities; entity documents say what kind of
thing an entity is, where it is from and what it is known for. Each document refers to other
entities of its world by a *partial* name (one shared token) or the full name, followed by a
hint taken from the referred entity's own description; these references are the mentions, with
Zeshel's inclusive whitespace-token offsets. Resolving "Kor" among the many entities called
"Kor ..." needs the context, so hard negatives (same-token entities) matter.

With three worlds or more the split is by world, as in Zeshel (the last world is ``test``, the
one before ``val``/dev, the rest ``train``); with fewer, mentions are split 80/10/10 at random.
The raw files go through :func:`hnce.pipeline.data.zeshel.convert_zeshel`, so the synthetic data
exercises the same path as the real Zeshel data.
"""

from __future__ import annotations

import json
import math
import random
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any

from hnce.errors import InputError
from hnce.pipeline.data.conversion import DatasetOutput
from hnce.pipeline.data.zeshel import convert_zeshel

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "th", "dr", "kr")
_VOWELS = ("a", "e", "i", "o", "u", "ae", "ou")
_CODAS = ("", "n", "r", "s", "th", "l", "x", "nd")
_KINDS = ("knight", "river", "city", "guild", "ship", "spell", "sword", "festival", "mountain")
_FILLER = ("the", "old", "story", "tells", "that", "in", "a", "time", "long", "ago", "we", "saw")


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(
        rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)
    )


# Without "dr", no word splits into syllables two ways (coda "nd" + "r" = coda "n" + "dr").
_UNAMBIGUOUS_ONSETS = tuple(onset for onset in _ONSETS if onset != "dr")
SYLLABLES = len(_UNAMBIGUOUS_ONSETS) * len(_VOWELS) * len(_CODAS)


def syllable_word(index: int, syllables: int) -> str:
    """The ``index``-th word of ``syllables`` syllables, for ``0 <= index < SYLLABLES **
    syllables``: distinct indices give distinct words."""
    parts = []
    for _ in range(syllables):
        index, syllable = divmod(index, SYLLABLES)
        onset, rest = divmod(syllable, len(_VOWELS) * len(_CODAS))
        vowel, coda = divmod(rest, len(_CODAS))
        parts.append(_UNAMBIGUOUS_ONSETS[onset] + _VOWELS[vowel] + _CODAS[coda])
    return "".join(parts)


def _distinct_words(rng: random.Random, count: int, syllables: int, taken: set[str]) -> list[str]:
    words: list[str] = []
    while len(words) < count:
        word = _word(rng, syllables)
        if word not in taken:
            taken.add(word)
            words.append(word)
    return words


def _world_split(world_index: int, num_worlds: int) -> str | None:
    if num_worlds < 3:
        return None
    if world_index == num_worlds - 1:
        return "test"
    return "val" if world_index == num_worlds - 2 else "train"


def _world_entities(rng: random.Random, world: str, count: int) -> list[dict[str, Any]]:
    """The entities of one world: two-token names from small pools (so every name token is
    shared), a kind, a place and three traits each."""
    taken: set[str] = set()
    pool = max(2, math.ceil(math.sqrt(count)))
    first_tokens = [w.capitalize() for w in _distinct_words(rng, pool, 1, taken)]
    last_tokens = [w.capitalize() for w in _distinct_words(rng, pool + 1, 2, taken)]
    places = [w.capitalize() for w in _distinct_words(rng, 6, 2, taken)]
    traits = _distinct_words(rng, 24, 2, taken)
    names = [(f, la) for f in first_tokens for la in last_tokens]
    rng.shuffle(names)
    entities = []
    for index in range(count):
        first, last = names[index % len(names)]
        if index >= len(names):
            last = f"{last}{index // len(names) + 1}"
        entities.append(
            {
                "document_id": f"{world}-{index:06d}",
                "name": (first, last),
                "kind": rng.choice(_KINDS),
                "place": rng.choice(places),
                "traits": rng.sample(traits, 3),
            }
        )
    return entities


def _mention_line(
    entity: dict[str, Any],
    number: int,
    world: str,
    tokens: list[str],
    span: tuple[int, int],
    gold: dict[str, Any],
) -> str:
    start, end = span
    record = {
        "mention_id": f"{entity['document_id']}-m{number}",
        "context_document_id": entity["document_id"],
        "corpus": world,
        "start_index": start,
        "end_index": end,
        "text": " ".join(tokens[start : end + 1]),
        "label_document_id": gold["document_id"],
        "category": "synthetic",
    }
    return json.dumps(record) + "\n"


def _write_world(
    rng: random.Random,
    raw_dir: Path,
    world_index: int,
    num_worlds: int,
    entities_per_world: int,
    mentions_per_entity: int,
    split_files: dict[str, IO[str]],
) -> int:
    """Write one world's documents file and its mentions; return the number of mentions."""
    world = f"world_{world_index:02d}"
    entities = _world_entities(rng, world, entities_per_world)
    mentions = 0
    with (raw_dir / "documents" / f"{world}.json").open("w", encoding="utf-8") as documents:
        for entity in entities:
            tokens, references = _document_tokens(rng, entity, entities, mentions_per_entity)
            document = {
                "document_id": entity["document_id"],
                "title": " ".join(entity["name"]),
                "text": " ".join(tokens),
            }
            documents.write(json.dumps(document) + "\n")
            for number, (start, end, gold) in enumerate(references):
                split = (
                    _world_split(world_index, num_worlds)
                    or rng.choices(("train", "val", "test"), weights=(8, 1, 1))[0]
                )
                split_files[split].write(
                    _mention_line(entity, number, world, tokens, (start, end), gold)
                )
                mentions += 1
    return mentions


def write_synthetic_zeshel(
    raw_dir: Path,
    num_worlds: int = 3,
    entities_per_world: int = 50,
    mentions_per_entity: int = 4,
    seed: int = 0,
) -> dict[str, int]:
    """Write raw Zeshel-format files (``documents/``, ``mentions/``) under ``raw_dir``.

    Returns the number of entities and mentions written. Deterministic for a given seed.
    """
    if num_worlds < 1 or entities_per_world < 2 or mentions_per_entity < 0:
        raise InputError(
            "a synthetic dataset needs at least 1 world of at least 2 entities and a "
            "non-negative number of mentions per entity"
        )
    rng = random.Random(seed)
    raw_dir = Path(raw_dir)
    (raw_dir / "documents").mkdir(parents=True, exist_ok=True)
    (raw_dir / "mentions").mkdir(parents=True, exist_ok=True)
    mentions = 0
    # all three split files exist even when a small random split leaves one empty
    with ExitStack() as stack:
        split_files = {
            split: stack.enter_context(
                (raw_dir / "mentions" / f"{split}.json").open("w", encoding="utf-8")
            )
            for split in ("train", "val", "test")
        }
        for world_index in range(num_worlds):
            mentions += _write_world(
                rng,
                raw_dir,
                world_index,
                num_worlds,
                entities_per_world,
                mentions_per_entity,
                split_files,
            )
    return {"entities": num_worlds * entities_per_world, "mentions": mentions}


def _document_tokens(
    rng: random.Random,
    entity: dict[str, Any],
    world_entities: list[dict[str, Any]],
    mentions_per_entity: int,
) -> tuple[list[str], list[tuple[int, int, dict[str, Any]]]]:
    """Tokens of one document and its references (inclusive token span, referred entity)."""
    first, last = entity["name"]
    traits = entity["traits"]
    tokens = [first, last, "is", "a", entity["kind"], "of", entity["place"], ",", "known", "for"]
    tokens += [traits[0], ",", traits[1], "and", traits[2], "."]
    references: list[tuple[int, int, dict[str, Any]]] = []
    others = [other for other in world_entities if other is not entity]
    for _ in range(mentions_per_entity):
        gold = rng.choice(others)
        tokens += rng.sample(_FILLER, 3)
        surface = rng.choices(
            (gold["name"][:1], gold["name"][1:], gold["name"]), weights=(4, 4, 2)
        )[0]
        start = len(tokens)
        tokens += list(surface)
        references.append((start, len(tokens) - 1, gold))
        hint = rng.choice(
            (
                ["the", gold["kind"]],
                ["of", gold["place"]],
                ["known", "for", rng.choice(gold["traits"])],
            )
        )
        tokens += [",", *hint, ","]
        if rng.random() < 0.5:
            tokens += ["famed", "for", rng.choice(gold["traits"])]
        tokens.append(".")
    return tokens, references


def generate_synthetic_dataset(
    output: DatasetOutput | Path,
    num_worlds: int = 3,
    entities_per_world: int = 50,
    mentions_per_entity: int = 4,
    seed: int = 0,
) -> dict[str, Any]:
    """Publish a synthetic dataset (``entities/``, ``mentions/``, ``summary.json``) through the
    Zeshel converter.

    Fast enough for unit tests (a few thousand rows in well under a second). Entity ids are
    dense over the worlds in order; every entity's domain is its world. Returns the summary.

    Example:
        >>> summary = generate_synthetic_dataset(tmp_path, 3, 20, 2, seed=1)  # doctest: +SKIP
        >>> EntityCatalogue.open(tmp_path)  # 60 entities, mentions/{train,dev,test}.parquet
    """
    generator = {
        "num_worlds": num_worlds,
        "entities_per_world": entities_per_world,
        "mentions_per_entity": mentions_per_entity,
        "seed": seed,
    }
    with tempfile.TemporaryDirectory(prefix="hnce-synthetic-") as raw:
        counts = write_synthetic_zeshel(Path(raw), **generator)
        return convert_zeshel(
            Path(raw),
            output,
            converter="synthetic",
            describe={"source": None, "generator": {**generator, **counts}},
        )
