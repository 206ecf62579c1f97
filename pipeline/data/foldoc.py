"""FOLDOC, the Free On-line Dictionary of Computing (Debian ``dict-foldoc``), as an entity-linking
dataset: the entries are the entities, the hyperlinks between them the mentions.

**Files** (dictd(8), dictfmt(1)). ``foldoc.index`` has one line per name,
``name<TAB>offset<TAB>length``, offset and length written in base64 digits (``A``-``Z``,
``a``-``z``, ``0``-``9``, ``+``, ``/``, most significant first) into the uncompressed text of
``foldoc.dict.dz`` (dictzip, which gzip reads). The index lowercases names and lists every name
of an entry, so several lines point at one span; each distinct span is one entry. The spans of
``00-database-*`` names are dictfmt's metadata (licence, introduction), not entries. An entry is
its name lines (the headword as FOLDOC spells it, then its other names: ``High Performance
Serial Bus``, ``1394``, ``FireWire``, ...), a blank line, then its indented text.

**Entities**: one per headword: ``key`` = ``title`` = the entry's first line, ``text`` = its
text with links shown as displayed (below), the ISO date stamps of its last update
(``(2018-05-22)``) dropped and whitespace collapsed; ``domain`` is ``""``. Numbered senses (``1.`` ``2.``) stay in
the one entity. Entries whose headwords are spelled exactly alike (four in the 2023 file:
Debian's own ``A4C``, ``developer``, ``maintainer`` and ``MTA`` after FOLDOC's) are one entity,
their texts in file order; headwords differing in case (``Flex``, ``FLEX``) are different
entries.

**Links** are written ``{target}``; the labelled form ``{text (target)}`` shows ``text`` and
links ``target``, which for a web link is an address (``{Patch Home (http://...)}``,
``{(ftp://...)}``, ``{RFC 1034 (rfc:1034)}``, ``{the Help page (help.html)}``). A link, its
whitespace collapsed, resolves in this order:

1. the whole link as a name (any name line) of an entry: spelled exactly, else ignoring case
   when only one entry has that name ignoring case (``{Tex}`` -> ``TeX``); it shows as written;
2. a web link (the link holds ``://``, or its target starts with a scheme such as ``rfc:`` or
   with ``/``, or ends in ``.html``, ``.htm`` or ``.xml``): not a mention, counted ``web``;
3. a labelled link whose target resolves as in 1 (``{loops (loop)}`` -> ``loop``).

A labelled or web link shows its text (its target when the text is empty), any other link its
whole text. A link left unresolved is *missing*, counted by kind: ``no_entry`` (no name matches)
or ``ambiguous`` (several entries match, ignoring case); one to its own entry is counted
``self``. A link to an entry rejected as a bad row (below) is ``no_entry``.

**Mentions**: every resolved link: ``mention`` = the link as shown, ``context_left`` /
``context_right`` = up to 300 characters of the entry's text (as in the entity) on each side,
cut at a space; ``gold`` = the target; ``mention_id`` = ``<key>#<n>``, ``n`` the link's 0-based
place among all the links of its entry.

**Split by document**: all mentions written in one entry land in one split, chosen by a seeded
hash of its key (80 / 10 / 10). An entity linked from a test entry may or may not be linked from
some training entry: the summary counts the dev and test mentions whose gold some train mention
links to (``seen``) and the others (``unseen``).

**Bad rows**: an index line that does not parse is ``missing_field``; an entry with bytes that
are not UTF-8 is ``invalid_utf8`` at its first such line (the line of the uncompressed
dictionary, under the ``.dict.dz`` file's name); an entry whose first line is blank is
``empty_key``, one with no text besides date stamps ``empty_text``. The dictionary (5.6 MB) is held in memory:
links resolve against every name, so all entries are read before any mention is written.
"""

from __future__ import annotations

import gzip
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hnce.cluster.stores.tables import SPLITS, Entity, Mention
from hnce.errors import InputError
from hnce.pipeline.data.bad_rows import BadRowKind, BadRowPolicy, InputRow, iter_text_lines
from hnce.pipeline.data.conversion import Conversion, DatasetOutput
from hnce.pipeline.data.fields import hashed_split
from hnce.progress import progress_bar
from hnce.text import NotText, decode_text

DEFAULT_FOLDOC_DIR = Path("/usr/share/dictd")
CONTEXT_CHARS = 300
CONVERTER_VERSION = 1

_BASE64 = {
    c: i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
}
_META = re.compile(r"00-?database")
_LINK = re.compile(r"\{([^{}]*)\}")
_DATE = re.compile(r"\(\d{4}-\d{1,2}-\d{1,2}\)")
_LABELLED = re.compile(r"(?:(.*\S)\s+)?\(([^()]+)\)")
_ADDRESS = re.compile(r"[a-z][a-z0-9+.-]*:\S|/|.*\.(?:html?|xml)$")


@dataclass
class Entry:
    """One headword: its names and raw text (several entries of one headword merged)."""

    key: str
    names: list[str]
    body: str


@dataclass(frozen=True)
class Link:
    """One ``{...}`` of an entry's text: where it is shown in the entity text, and how it
    resolved (``gold`` is None unless ``outcome`` is ``exact``, ``case_insensitive`` or
    ``labelled``)."""

    number: int
    start: int
    end: int
    outcome: str
    gold: int | None


def base64_number(digits: str) -> int:
    """A dictd index number (base64 digits, most significant first); ValueError if not one."""
    if not digits:
        raise ValueError("empty number")
    value = 0
    for digit in digits:
        if digit not in _BASE64:
            raise ValueError(f"{digits!r} is not a base64 number")
        value = value * 64 + _BASE64[digit]
    return value


def dictionary_files(foldoc_dir: Path) -> tuple[Path, Path]:
    """``(foldoc.index, foldoc.dict.dz)`` in ``foldoc_dir``; both must exist."""
    files = (foldoc_dir / "foldoc.index", foldoc_dir / "foldoc.dict.dz")
    missing = [str(path) for path in files if not path.exists()]
    if missing:
        raise InputError(
            f"FOLDOC files not found: {', '.join(missing)} (Debian: apt-get install dict-foldoc)"
        )
    return files


def read_spans(index: Path, policy: BadRowPolicy) -> list[tuple[int, int]]:
    """The distinct ``(offset, length)`` of the entries named in ``index``, in file order."""
    spans: set[tuple[int, int]] = set()
    for line_number, line in iter_text_lines(index, policy):
        fields = line.rstrip("\r\n").split("\t")
        if not line.strip() or (len(fields) == 3 and _META.match(fields[0])):
            continue
        try:
            if len(fields) != 3:
                raise ValueError(f"expected 3 tab-separated fields, got {len(fields)}")
            spans.add((base64_number(fields[1]), base64_number(fields[2])))
        except ValueError as error:
            InputRow(index, line_number, line, {}).reject(
                policy, BadRowKind.MISSING_FIELD, f"malformed dictd index line: {error}"
            )
    return sorted(spans)


def read_entries(
    dictionary: Path, spans: list[tuple[int, int]], policy: BadRowPolicy
) -> list[Entry]:
    """The entries at ``spans`` of the uncompressed dictionary, one per headword (module
    docstring); an entry that is a bad row is reported and left out."""
    try:
        with gzip.open(dictionary) as handle:
            data = handle.read()
    except (OSError, EOFError) as error:
        raise InputError(f"{dictionary}: not a dictzip (gzip) file: {error}") from None
    entries: dict[str, Entry] = {}
    line_number, position = 1, 0
    for offset, length in progress_bar(spans, desc="foldoc entries"):
        if offset + length > len(data):
            raise InputError(
                f"{dictionary}: the index points past the end ({offset + length} > {len(data)} "
                "bytes): foldoc.index and foldoc.dict.dz are not one pair"
            )
        line_number += data.count(b"\n", position, offset)
        position = offset
        entry = _parse_entry(dictionary, line_number, data[offset : offset + length], policy)
        if entry is None:
            continue
        if entry.key in entries:
            merged = entries[entry.key]
            merged.names += [name for name in entry.names if name not in merged.names]
            merged.body += "\n\n" + entry.body
        else:
            entries[entry.key] = entry
    return list(entries.values())


def _parse_entry(path: Path, first_line: int, raw: bytes, policy: BadRowPolicy) -> Entry | None:
    lines = []
    for number, raw_line in enumerate(raw.split(b"\n"), start=first_line):
        try:
            lines.append(decode_text(raw_line, f"{path}:{number}"))
        except NotText as error:
            escaped = raw.decode("utf-8", "backslashreplace")
            policy.reject(BadRowKind.INVALID_UTF8, path, number, escaped, error.detail)
            return None
    text = "\n".join(lines)
    row = InputRow(path, first_line, text, {})
    if not lines[0].strip():
        row.reject(policy, BadRowKind.EMPTY_KEY, "the entry's first line (its headword) is blank")
        return None
    head, _, body = text.partition("\n\n")
    names = [" ".join(name.split()) for name in head.split("\n") if name.strip()]
    if not _DATE.sub("", body).strip():
        row.reject(policy, BadRowKind.EMPTY_TEXT, f"entry {names[0]!r} has no text")
        return None
    return Entry(names[0], names, body)


class Names:
    """Resolves a name to the one entity that has it: spelled exactly, else ignoring case."""

    def __init__(self, entries: list[Entry]) -> None:
        self._exact: dict[str, set[int]] = {}
        self._folded: dict[str, set[int]] = {}
        for entity_id, entry in enumerate(entries):
            for name in entry.names:
                self._exact.setdefault(name, set()).add(entity_id)
                self._folded.setdefault(name.casefold(), set()).add(entity_id)

    def resolve(self, name: str) -> tuple[str, int | None]:
        """``(outcome, entity_id)``: ``exact`` or ``case_insensitive`` with the entity,
        ``ambiguous`` or ``no_entry`` with None."""
        for outcome, found in (
            ("exact", self._exact.get(name, set())),
            ("case_insensitive", self._folded.get(name.casefold(), set())),
        ):
            if len(found) == 1:
                return outcome, next(iter(found))
            if found:
                return "ambiguous", None
        return "no_entry", None


def _classify(link: str, names: Names) -> tuple[str, str, int | None]:
    """``(shown text, outcome, gold)`` of one link, its whitespace collapsed (module docstring)."""
    outcome, gold = names.resolve(link)
    if gold is not None:
        return link, outcome, gold
    labelled = _LABELLED.fullmatch(link)
    if labelled is None:
        web = "://" in link or _ADDRESS.match(link) is not None
        return link, "web" if web else outcome, None
    text, target = labelled.group(1) or "", labelled.group(2).strip()
    shown = text or target
    if "://" in link or _ADDRESS.match(target):
        return shown, "web", None
    target_outcome, gold = names.resolve(target)
    if gold is not None:
        return shown, "labelled", gold
    return shown, "ambiguous" if "ambiguous" in (outcome, target_outcome) else outcome, None


def _collapse(text: str, first: bool) -> str:
    collapsed = re.sub(r"\s+", " ", text)
    return collapsed.lstrip() if first else collapsed


def render(body: str, names: Names) -> tuple[str, list[Link]]:
    """The entity text of an entry's raw ``body`` and its links, placed in that text."""
    body = _DATE.sub(" ", body)
    pieces: list[str] = []
    links: list[Link] = []
    length = plain_start = 0
    for number, match in enumerate(_LINK.finditer(body)):
        plain = _collapse(body[plain_start : match.start()], first=not pieces)
        shown, outcome, gold = _classify(" ".join(match.group(1).split()), names)
        pieces += [plain, shown]
        start = length + len(plain)
        length = start + len(shown)
        links.append(Link(number, start, length, outcome, gold))
        plain_start = match.end()
    pieces.append(_collapse(body[plain_start:], first=not pieces))
    return "".join(pieces).rstrip(), links


def context(text: str, start: int, end: int) -> tuple[str, str]:
    """Up to :data:`CONTEXT_CHARS` of ``text`` each side of ``[start, end)``, cut at a space."""
    left = text[max(0, start - CONTEXT_CHARS) : start]
    if start > CONTEXT_CHARS:
        left = left.partition(" ")[2]
    right = text[end : end + CONTEXT_CHARS]
    if end + CONTEXT_CHARS < len(text):
        right = right.rpartition(" ")[0]
    return left.strip(), right.strip()


def split_for_entry(key: str, seed: int) -> str:
    """Seeded hash split of an entry: every mention written in it lands in the same split."""
    return hashed_split(key, seed)


@dataclass
class _Tally:
    """What the summary reports, counted while converting."""

    links: Counter[str] = field(default_factory=Counter)
    golds: dict[str, Counter[int]] = field(
        default_factory=lambda: {split: Counter() for split in SPLITS}
    )

    def summary(self) -> dict[str, Any]:
        mentions = {split: sum(golds.values()) for split, golds in self.golds.items()}
        linked_in_train = self.golds["train"].keys()
        seen = {
            split: sum(n for gold, n in self.golds[split].items() if gold in linked_in_train)
            for split in ("dev", "test")
        }
        return {
            "mentions": mentions,
            "mentions_total": sum(mentions.values()),
            "seen": seen,
            "unseen": {split: mentions[split] - seen[split] for split in seen},
            "links": {
                "total": sum(self.links.values()),
                "resolved": {
                    outcome: self.links[outcome]
                    for outcome in ("exact", "case_insensitive", "labelled")
                },
                "self": self.links["self"],
                "web": self.links["web"],
                "missing": {outcome: self.links[outcome] for outcome in ("no_entry", "ambiguous")},
            },
        }


def _mentions(
    entry: Entry, entity_id: int, text: str, links: list[Link], tally: _Tally, split: str
) -> Iterator[Mention]:
    """The mentions of one entry's resolved links (a link to the entry itself is ``self``)."""
    for link in links:
        if link.gold == entity_id:
            tally.links["self"] += 1
            continue
        tally.links[link.outcome] += 1
        if link.gold is None:
            continue
        tally.golds[split][link.gold] += 1
        left, right = context(text, link.start, link.end)
        yield Mention(
            mention_id=f"{entry.key}#{link.number}",
            context_left=left,
            mention=text[link.start : link.end],
            context_right=right,
            gold=link.gold,
        )


def convert_foldoc(
    output: DatasetOutput | Path,
    foldoc_dir: Path = DEFAULT_FOLDOC_DIR,
    seed: int = 0,
) -> dict[str, Any]:
    """Publish the FOLDOC dataset ``output``; return its summary.

    Reads every entry first (links resolve against all names), writes the catalogue, then each
    entry's mentions into its entry's split.
    """
    foldoc_dir = Path(foldoc_dir)
    index, dictionary = dictionary_files(foldoc_dir)
    inputs = [("foldoc.index", index), ("foldoc.dict.dz", dictionary)]
    with Conversion(output, "foldoc", CONVERTER_VERSION, inputs) as conversion:
        with conversion.stage("read entries"):
            spans = read_spans(index, conversion.policy)
            entries = read_entries(dictionary, spans, conversion.policy)
            names = Names(entries)
            rendered = [render(entry.body, names) for entry in entries]
        with conversion.stage("entities"), conversion.builder.entities() as writer:
            for entity_id, (entry, (text, _)) in enumerate(zip(entries, rendered, strict=True)):
                writer.write(Entity(entity_id, entry.key, entry.key, text))
        conversion.catalogue()
        tally = _Tally()
        with conversion.stage("mentions"):
            writers = {split: conversion.builder.mentions(split) for split in SPLITS}
            for entity_id, (entry, (text, links)) in enumerate(zip(entries, rendered, strict=True)):
                split = split_for_entry(entry.key, seed)
                for mention in _mentions(entry, entity_id, text, links, tally, split):
                    writers[split].write(mention)
            for split_writer in writers.values():
                split_writer.close()
        summary = {"format": "foldoc", "source": str(foldoc_dir), "seed": seed}
        return conversion.publish(
            {**summary, "entries": len(spans), "entities": writer.count, **tally.summary()}
        )
