"""WordNet 3.0 (Debian ``wordnet-base``) as an entity-linking dataset.

Entities are synsets read from ``data.{noun,verb,adj,adv}``: ``key`` is ``<pos>.<offset>``
(``n.02084071``; pos is the file's letter n / v / a / r, adjective satellites included under
``a``), ``title`` the first lemma with underscores as spaces, ``text`` the lemmas and the
definition, never the example sentences (they are the mentions and would leak the answer).

Mentions are the double-quoted example sentences of a gloss that contain a lemma of their own
synset, in its base form or inflected: irregular forms come from WordNet's exception lists
(``<pos>.exc``), regular ones from English suffix rules (plural -s/-es/-ies; -ed/-ing with a
dropped e or doubled consonant; comparative -er/-est). Multiword lemmas inflect their last word
(nouns, adjectives) or first word (verbs), and match across spaces or hyphens. The first, longest
match in the sentence is the mention; its left and right context are the rest of the sentence.

A mention is *ambiguous* when its lemma names more than one synset of its part of speech (the
summary also gives the count over all parts of speech). The split keeps lemmas apart: every
mention of a lemma lands in the split chosen by a seeded hash of the lemma (80 / 10 / 10), so
dev and test lemmas are never seen in training (zero-shot in the sense of the Zeshel paper):
their synsets are *unseen* entities. One exception gives dev and test *seen* entities too: a
synset whose train-lemma examples are two or more keeps the first of them in train and sends
the others, alternately, to test and dev, so that a test mention may be another context of an
entity some training mention links to (the regime of BLINK's Wikipedia anchors). The summary
counts, per split, the mentions of entities the train split links to (``seen_mentions``).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hnce.cluster.stores.tables import SPLITS, Entity, Mention
from hnce.errors import InputError
from hnce.pipeline.data.bad_rows import BadRowKind, BadRowPolicy, InputRow, chunked, iter_text_lines
from hnce.pipeline.data.conversion import Conversion, DatasetOutput
from hnce.pipeline.data.fields import KeySet, hashed_split, write_unique_entities
from hnce.progress import progress_bar

DEFAULT_WORDNET_DIR = Path("/usr/share/wordnet")
#: data file suffix -> (key prefix, part of speech used for inflection and exceptions)
PARTS_OF_SPEECH: dict[str, tuple[str, str]] = {
    "noun": ("n", "noun"),
    "verb": ("v", "verb"),
    "adj": ("a", "adj"),
    "adv": ("r", "adv"),
}
#: where a train-lemma synset's n-th example goes for n >= 2 (seen entities): index n % 2, so the
#: second goes to test, the third to dev, the fourth to test, ...
HELD_OUT_SEEN = ("test", "dev")
CONVERTER_VERSION = 3
_CHUNK = 4096

_ADJECTIVE_MARKER = re.compile(r"\((?:a|p|ip)\)$")
_EXAMPLE = re.compile(r'"([^"]*)"')
_VOWELS = set("aeiou")


@dataclass(frozen=True)
class Synset:
    """One parsed line of a WordNet data file."""

    key: str
    pos: str
    lemmas: tuple[str, ...]  # as written, underscores replaced by spaces
    definition: str
    examples: tuple[str, ...]

    @property
    def title(self) -> str:
        return self.lemmas[0]

    @property
    def text(self) -> str:
        return (
            f"{', '.join(self.lemmas)}: {self.definition}"
            if self.definition
            else ", ".join(self.lemmas)
        )


def parse_data_line(line: str, prefix: str, pos: str) -> Synset:
    """Parse one synset line of ``data.<pos>`` (format of WordNet's wndb(5WN) manual page).

    ``offset lex_filenum ss_type w_cnt(hex) [word lex_id]... p_cnt [ptr]... [frames] | gloss``
    """
    body, _, gloss = line.partition(" | ")
    fields = body.split()
    offset = fields[0]
    word_count = int(fields[3], 16)
    words = fields[4 : 4 + 2 * word_count : 2]
    if word_count < 1 or len(words) != word_count or not offset.isdigit():
        raise ValueError(f"expected {word_count} (at least one) words in synset {offset}")
    lemmas = tuple(_ADJECTIVE_MARKER.sub("", word).replace("_", " ").strip() for word in words)
    if not all(lemmas):
        raise ValueError(f"an empty lemma in synset {offset}")
    gloss = gloss.strip()
    examples = tuple(example.strip() for example in _EXAMPLE.findall(gloss) if example.strip())
    definition = _EXAMPLE.sub("", gloss)
    definition = re.sub(r"\s*;\s*(?:;\s*)*", "; ", definition).strip(" ;")
    return Synset(f"{prefix}.{offset}", pos, lemmas, definition, examples)


def iter_synsets(
    data_file: Path, prefix: str, pos: str, policy: BadRowPolicy
) -> Iterator[tuple[InputRow, Synset]]:
    """Stream ``(row, synset)`` from one data file; the license header (lines starting with two
    spaces) is not data, a line that does not parse is a ``missing_field`` bad row."""
    for line_number, line in iter_text_lines(data_file, policy):
        if line.startswith("  ") or not line.strip():
            continue
        row = InputRow(Path(data_file), line_number, line, {})
        try:
            yield row, parse_data_line(line, prefix, pos)
        except (ValueError, IndexError) as error:
            row.reject(policy, BadRowKind.MISSING_FIELD, f"malformed WordNet data line: {error}")


def read_exceptions(wordnet_dir: Path, pos: str, policy: BadRowPolicy) -> dict[str, set[str]]:
    """Base form -> irregular inflected forms, from ``<pos>.exc`` (lines ``inflected base...``)."""
    inflections: dict[str, set[str]] = {}
    path = Path(wordnet_dir) / f"{pos}.exc"
    if not path.exists():
        return inflections
    for _, line in iter_text_lines(path, policy):
        parts = line.split()
        for base in parts[1:]:
            inflections.setdefault(base.replace("_", " "), set()).add(parts[0].replace("_", " "))
    return inflections


def _doubles_final_consonant(word: str) -> bool:
    return (
        len(word) >= 3
        and word[-1] not in _VOWELS | {"w", "x", "y"}
        and word[-2] in _VOWELS
        and word[-3] not in _VOWELS
    )


def regular_inflections(word: str, pos: str) -> set[str]:
    """Regular English inflections of one word for a part of speech (over-generating is fine:
    the forms are only searched for inside the synset's own examples)."""
    forms = {word}
    if not word.isalpha():
        return forms
    sibilant = word.endswith(("s", "x", "z", "ch", "sh"))
    consonant_y = len(word) > 1 and word.endswith("y") and word[-2] not in _VOWELS
    if pos in ("noun", "verb"):
        forms.add(word + ("es" if sibilant else "s"))
        if consonant_y:
            forms.add(word[:-1] + "ies")
        if word.endswith("man"):
            forms.add(word[:-3] + "men")
    if pos == "verb":
        stem = word[:-1] if word.endswith("e") and not word.endswith("ee") else word
        forms |= {stem + "ed", stem + "ing", word + "d"}
        if consonant_y:
            forms.add(word[:-1] + "ied")
        if word.endswith("ie"):
            forms.add(word[:-2] + "ying")
        if _doubles_final_consonant(word):
            forms |= {word + word[-1] + "ed", word + word[-1] + "ing"}
    if pos in ("adj", "adv"):
        if word.endswith("e"):
            forms |= {word + "r", word + "st"}
        elif consonant_y:
            forms |= {word[:-1] + "ier", word[:-1] + "iest"}
        else:
            forms |= {word + "er", word + "est"}
        if _doubles_final_consonant(word):
            forms |= {word + word[-1] + "er", word + word[-1] + "est"}
    return forms


def lemma_forms(lemma: str, pos: str, exceptions: dict[str, set[str]]) -> set[str]:
    """Surface forms of a (possibly multiword) lemma: base, irregular and regular inflections."""
    lower = lemma.lower()
    forms = {lower} | exceptions.get(lower, set())
    words = lower.split(" ")
    head = 0 if pos == "verb" else len(words) - 1
    for inflected in regular_inflections(words[head], pos) | exceptions.get(words[head], set()):
        forms.add(" ".join([*words[:head], inflected, *words[head + 1 :]]))
    return forms


def _normalized(text: str) -> str:
    return re.sub(r"[\s_\-]+", "", text.lower())


def _form_pattern(form: str) -> str:
    parts = re.split(r"([\s\-]+)", form)
    return "".join(
        (r"[\s\-]?" if "-" in part else r"[\s\-]+") if i % 2 else re.escape(part)
        for i, part in enumerate(parts)
    )


class LemmaMatcher:
    """Finds a synset's own lemmas (any surface form) in its example sentences."""

    def __init__(self, lemmas: tuple[str, ...], pos: str, exceptions: dict[str, set[str]]) -> None:
        self._form_to_lemma: dict[str, str] = {}
        for lemma in lemmas:
            for form in lemma_forms(lemma, pos, exceptions):
                self._form_to_lemma.setdefault(_normalized(form), lemma.lower())
        forms = sorted(
            {f for lemma in lemmas for f in lemma_forms(lemma, pos, exceptions)},
            key=len,
            reverse=True,
        )
        self._pattern = re.compile(
            r"(?<![\w])(?:" + "|".join(_form_pattern(f) for f in forms) + r")(?![\w])",
            re.IGNORECASE,
        )
        self._default = lemmas[0].lower()

    def find(self, example: str) -> tuple[int, int, str] | None:
        """The first (then longest) lemma form in ``example``: (start, end, lemma)."""
        match = self._pattern.search(example)
        if match is None:
            return None
        lemma = self._form_to_lemma.get(_normalized(match.group(0)), self._default)
        return match.start(), match.end(), lemma


def split_for_lemma(lemma: str, seed: int) -> str:
    """Seeded hash split of a lemma: every mention of a lemma lands in the same split."""
    return hashed_split(lemma, seed)


def data_files(wordnet_dir: Path) -> list[tuple[Path, str, str]]:
    """``(data.<pos> path, key prefix, part of speech)`` of each part of speech; all must exist."""
    found = [(wordnet_dir / f"data.{suffix}", *spec) for suffix, spec in PARTS_OF_SPEECH.items()]
    missing = [str(path) for path, _, _ in found if not path.exists()]
    if missing:
        raise InputError(
            f"WordNet data files not found: {', '.join(missing)} "
            "(Debian: apt-get install wordnet-base)"
        )
    return found


@dataclass
class _Tally:
    """What the summary reports, counted while converting."""

    synsets_per_pos: Counter[str] = field(default_factory=Counter)
    # keyed by (pos, lemma) and ("*", lemma): ambiguity within a part of speech and across all
    synsets_per_lemma: Counter[tuple[str, str]] = field(default_factory=Counter)
    mention_lemmas: dict[str, Counter[tuple[str, str]]] = field(
        default_factory=lambda: {split: Counter() for split in SPLITS}
    )
    seen_mentions: Counter[str] = field(default_factory=Counter)
    examples: int = 0
    examples_without_lemma: int = 0

    def add_synset(self, synset: Synset) -> None:
        self.synsets_per_pos[synset.pos] += 1
        self.synsets_per_lemma.update({(synset.pos, lemma.lower()) for lemma in synset.lemmas})
        self.synsets_per_lemma.update({("*", lemma.lower()) for lemma in synset.lemmas})

    def summary(self) -> dict[str, Any]:
        per_split = self.mention_lemmas.items()
        mentions = {split: sum(counts.values()) for split, counts in per_split}
        ambiguous = {
            split: sum(n for key, n in counts.items() if self.synsets_per_lemma[key] > 1)
            for split, counts in per_split
        }
        ambiguous_any_pos = {
            split: sum(
                n for (_, lemma), n in counts.items() if self.synsets_per_lemma["*", lemma] > 1
            )
            for split, counts in per_split
        }
        return {
            "synsets_per_pos": dict(self.synsets_per_pos),
            "examples": self.examples,
            "examples_without_lemma": self.examples_without_lemma,
            "mentions": mentions,
            "mentions_total": sum(mentions.values()),
            "seen_mentions": {split: self.seen_mentions[split] for split in SPLITS},
            "ambiguous": ambiguous,
            "ambiguous_total": sum(ambiguous.values()),
            "ambiguous_any_pos": ambiguous_any_pos,
            "ambiguous_any_pos_total": sum(ambiguous_any_pos.values()),
            "mention_lemmas": {
                split: len({lemma for _, lemma in counts}) for split, counts in per_split
            },
        }


def _example_mentions(
    synset: Synset, entity_id: int, exceptions: dict[str, set[str]], seed: int, tally: _Tally
) -> Iterator[tuple[str, Mention]]:
    """``(split, mention)`` of each example sentence of ``synset`` that holds one of its lemmas."""
    if not synset.examples:
        return  # compiling a matcher is most of the conversion's time: only when it is used
    matcher = LemmaMatcher(synset.lemmas, synset.pos, exceptions)
    in_train = 0  # this synset's train-lemma examples so far: the second on are held out (seen)
    for number, example in enumerate(synset.examples):
        tally.examples += 1
        found = matcher.find(example)
        if found is None:
            tally.examples_without_lemma += 1
            continue
        start, end, lemma = found
        split = split_for_lemma(lemma, seed)
        if split == "train":
            in_train += 1
            if in_train > 1:
                split = HELD_OUT_SEEN[in_train % 2]
                tally.seen_mentions[split] += 1
        tally.mention_lemmas[split][(synset.pos, lemma)] += 1
        yield (
            split,
            Mention(
                mention_id=f"{synset.key}.{number}",
                context_left=example[:start].strip(),
                mention=example[start:end],
                context_right=example[end:].strip(),
                gold=entity_id,
            ),
        )


def convert_wordnet(
    output: DatasetOutput | Path,
    wordnet_dir: Path = DEFAULT_WORDNET_DIR,
    seed: int = 0,
) -> dict[str, Any]:
    """Publish the WordNet dataset ``output``; return its summary.

    One streaming pass over the data files writes the catalogue and the example mentions (a
    mention's gold is its synset, written just before it); ambiguity is counted at the end, once
    every lemma's synsets are known.
    """
    wordnet_dir = Path(wordnet_dir)
    files = data_files(wordnet_dir)
    inputs = [(f"data.{pos}", path) for path, _, pos in files]
    inputs += [
        (f"{pos}.exc", wordnet_dir / f"{pos}.exc")
        for _, _, pos in files
        if (wordnet_dir / f"{pos}.exc").exists()
    ]
    with Conversion(output, "wordnet", CONVERTER_VERSION, inputs) as conversion:
        policy = conversion.policy
        tally = _Tally()
        keys = KeySet()
        writers = {split: conversion.builder.mentions(split) for split in SPLITS}
        with conversion.stage("synsets and mentions"), conversion.builder.entities() as entities:
            for path, prefix, pos in files:
                exceptions = read_exceptions(wordnet_dir, pos, policy)
                synsets = progress_bar(
                    iter_synsets(path, prefix, pos, policy), desc=f"wordnet {pos}"
                )
                for chunk in chunked(synsets, _CHUNK):
                    by_key: dict[str, Synset] = {}
                    for _, synset in chunk:
                        by_key.setdefault(synset.key, synset)
                    rows = [(row, Entity(-1, s.key, s.title, s.text)) for row, s in chunk]
                    for written in write_unique_entities(rows, entities, keys, policy, "synset"):
                        synset = by_key[written.key]
                        tally.add_synset(synset)
                        for split, mention in _example_mentions(
                            synset, written.entity_id, exceptions, seed, tally
                        ):
                            writers[split].write(mention)
        for writer in writers.values():
            writer.close()
        conversion.catalogue()
        summary = {"format": "wordnet", "source": str(wordnet_dir), "seed": seed}
        return conversion.publish({**summary, "entities": entities.count, **tally.summary()})
