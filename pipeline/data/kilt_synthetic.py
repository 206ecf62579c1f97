"""A seeded KILT knowledge source and AIDA files at Wikipedia scale, in KILT's exact formats.

``hnce data synthetic-kilt --out RAW --pages 5903530`` writes, under ``RAW/``::

    kilt_knowledgesource.json          one page per line: {_id, wikipedia_id, wikipedia_title,
                                       text: [title line, paragraphs...], anchors, categories,
                                       history, wikidata_info}
    aidayago2-{train,dev,test}-kilt.jsonl   {id, input (with [START_ENT] / [END_ENT]), output:
                                       [{answer, provenance: [{wikipedia_id, title}]}],
                                       meta: {left_context, mention, right_context}}
    generator.json                     the parameters and each file's SHA-256, written last

which ``hnce data kilt --knowledge-source RAW/kilt_knowledgesource.json --aida RAW/aidayago2-*``
converts like the real files. Defaults: KILT's 5,903,530 pages and AIDA's 18,395 / 4,784 / 4,463
train / dev / test mentions.

**Text lengths.** The text of a page is a lead of L characters, L log-normal with median 900
(``lead_median_chars``) and σ = 0.6, clipped to [120, 8000] (then a "Section::::" header and a
bullet list on a third of the pages, as KILT keeps them). Wikipedia leads run from one-line stubs
to several paragraphs with a median of a few hundred words' worth of characters; at about 5
characters per WordPiece token a 128-token entity window holds ~640 characters, so ~70% of the
pages fill it (P(L < 640) ≈ 0.29) and the rest are stubs, as in Wikipedia, where the converter's
2,048-character cut and the encoder's 128 tokens are what bound the cost, not the page. A smaller
median (``--lead-median-chars 150``) writes a catalogue of stubs for short entity windows (32
tokens hold ~160 characters) at a fraction of the bytes and the generation, conversion and
tokenization time.

**Names that make hard negatives matter.** Pages come in *families* that share a name token: a
family of size k has a primary page titled ``Kelvaron``, and pages such as ``Kelvaron (band)``,
``Kelvaron (river)``, ``Mira Kelvaron`` (a person), each of a different kind with its own topic
vocabulary. Families have 1-16 members (mean ~3; ~70% of pages share their name with another
page); places and first names come from pools shared by the whole catalogue. An AIDA mention
names its gold by the family token only (or a person's full name), so every other family member
is a candidate with the same surface form, and the context (topic words of the gold's kind, its
place) is what tells them apart. Golds are drawn from families of two or more pages.

**Streaming, deterministic, restartable.** A page is a pure function of (seed, line): its name
family comes from a block of 16 slots reached through a fixed permutation of the lines (so
families do not sit next to each other in the file), its text from a generator seeded by the
line. The knowledge source is written in parts of ``part_lines`` pages, each published by rename
under ``RAW/.kilt-parts/``; an interrupted run restarts at the first missing part, and the parts
are then concatenated into the final file. Memory is constant (one page at a time); the output is
byte-identical for a seed.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import NotRequired

from pydantic import ConfigDict, TypeAdapter
from typing_extensions import TypedDict

from hnce.cluster.stores.files import AtomicPath, atomic_write_json, sha256_file
from hnce.documents import read_resumable
from hnce.errors import InputError
from hnce.pipeline.data.synthetic import SYLLABLES, syllable_word
from hnce.progress import progress_bar

KILT_PAGES = 5_903_530
AIDA_MENTIONS = {"train": 18_395, "dev": 4_784, "test": 4_463}
KNOWLEDGE_SOURCE = "kilt_knowledgesource.json"
GENERATOR_FILE = "generator.json"
GENERATOR_VERSION = 1
PARTS_DIR = ".kilt-parts"
BLOCK = 16
LEAD_MEDIAN_CHARS = 900
LEAD_SIGMA = 0.6
LEAD_CHARS = (120, 8000)
PLACES = 20_000
FIRST_NAMES = 3_000
#: family sizes and their weights within a block of BLOCK slots
FAMILY_SIZES = ((1, 35), (2, 20), (3, 15), (4, 10), (6, 10), (8, 6), (16, 4))
KINDS: dict[str, tuple[str, ...]] = {
    "person": ("born", "career", "married", "award", "studied", "university", "died", "worked"),
    "city": ("population", "municipality", "capital", "district", "mayor", "region", "census"),
    "band": ("album", "rock", "singer", "guitarist", "toured", "formed", "records", "debut"),
    "album": ("released", "tracks", "studio", "producer", "chart", "single", "label"),
    "river": ("flows", "tributary", "basin", "source", "mouth", "valley", "bridge", "kilometres"),
    "football club": ("league", "stadium", "season", "promoted", "cup", "players", "coach"),
    "film": ("directed", "starring", "premiered", "box", "office", "screenplay", "drama"),
    "ship": ("launched", "navy", "tons", "crew", "sank", "vessel", "commissioned", "harbour"),
    "novel": ("published", "author", "chapters", "characters", "fiction", "edition", "narrator"),
    "company": ("headquarters", "revenue", "employees", "products", "shares", "acquired"),
    "village": ("parish", "church", "rural", "farming", "inhabitants", "county", "manor"),
    "song": ("lyrics", "recorded", "single", "cover", "verse", "melody", "charted"),
    "mountain": ("summit", "elevation", "range", "climbers", "peak", "glacier", "slopes"),
    "school": ("students", "campus", "pupils", "headmaster", "curriculum", "academy"),
    "politician": ("elected", "party", "minister", "parliament", "election", "government"),
    "painter": ("paintings", "exhibited", "canvas", "portrait", "gallery", "museum", "landscape"),
}
COMMON_WORDS = (
    *("the", "of", "and", "in", "a", "to", "was", "is", "for", "on", "as", "with", "by", "at"),
    *("from", "its", "which", "that", "after", "during", "first", "new", "one", "two", "also"),
    *("known", "other", "between", "several", "later", "early", "years", "most", "many"),
    *("where", "when", "under", "history", "local", "national", "world", "century", "north"),
    *("south", "east", "west", "area", "group", "time", "period", "public", "second", "series"),
    *("received", "modern", "original", "main", "large", "small", "former", "following"),
)
#: each topic word is drawn this many times as often as a common word (~30% of the words)
TOPIC_WEIGHT = 4
_KIND_NAMES = tuple(KINDS)
_FAMILY_PRIME = 2_654_435_761  # coprime to SYLLABLES ** 3: family ids -> distinct words


@dataclass(frozen=True)
class Page:
    """One generated page: what the AIDA mentions need to know about their gold."""

    line: int
    wikipedia_id: str
    title: str
    family: str
    kind: str
    place: str
    first_name: str
    family_size: int


def _name(index: int) -> str:
    """A capitalized two-syllable name (places, first names)."""
    return syllable_word(index % SYLLABLES**2, 2).capitalize()


def _coprime_multiplier(pages: int, start: int) -> int:
    multiplier = start % pages or 1
    while math.gcd(multiplier, pages) != 1:
        multiplier += 1
    return multiplier


class KiltWorld:
    """The generated catalogue: :meth:`page` and :meth:`page_line` for any line, in O(1)."""

    def __init__(
        self, pages: int = KILT_PAGES, seed: int = 0, lead_median_chars: int = LEAD_MEDIAN_CHARS
    ) -> None:
        if pages < BLOCK:
            raise InputError(f"a synthetic KILT catalogue needs at least {BLOCK} pages")
        if not LEAD_CHARS[0] <= lead_median_chars <= LEAD_CHARS[1]:
            raise InputError(f"the lead's median must lie in {list(LEAD_CHARS)} characters")
        self.pages = pages
        self.seed = seed
        self.lead_median_chars = lead_median_chars
        self._multiplier = _coprime_multiplier(pages, 0x9E3779B1 + seed)
        self._offset = (seed * 7_919) % pages
        self._inverse = pow(self._multiplier, -1, pages)
        self._weights = [weight for _, weight in FAMILY_SIZES]
        self._places = [_name(i * 7_901) for i in range(PLACES)]
        self._first_names = [_name(i * 104_729) for i in range(FIRST_NAMES)]
        self._vocabulary = {
            kind: [*COMMON_WORDS, *topic * TOPIC_WEIGHT] for kind, topic in KINDS.items()
        }

    def wikipedia_id(self, line: int) -> str:
        """Increasing, unique, and not dense: like real page ids."""
        return str(12 + 10 * line + (line * 7) % 10)

    def _slot(self, line: int) -> int:
        return (line * self._multiplier + self._offset) % self.pages

    def line_of(self, slot: int) -> int:
        return ((slot - self._offset) * self._inverse) % self.pages

    def _families(self, block: int) -> list[tuple[int, int]]:
        """(first slot in block, size) of each family of ``block``, seeded by the block."""
        rng = random.Random(self.seed * 1_000_003 + block)
        families, position = [], 0
        while position < BLOCK:
            size = rng.choices(FAMILY_SIZES, self._weights)[0][0]
            size = min(size, BLOCK - position)
            families.append((position, size))
            position += size
        return families

    def _family_of(self, slot: int) -> tuple[int, int, int]:
        """(family id, size, member index) of the page in ``slot``."""
        block, position = divmod(slot, BLOCK)
        for first, size in self._families(block):
            if first <= position < first + size:
                return block * BLOCK + first, size, position - first
        raise AssertionError("a block's families cover every slot")

    def page(self, line: int) -> Page:
        slot = self._slot(line)
        family_id, size, member = self._family_of(slot)
        family_rng = random.Random(self.seed * 1_000_033 + family_id)
        kinds = family_rng.sample(_KIND_NAMES, min(size, len(_KIND_NAMES)))
        kind = kinds[member % len(kinds)]
        family = syllable_word((family_id * _FAMILY_PRIME) % SYLLABLES**3, 3).capitalize()
        rng = random.Random(self.seed * 1_000_037 + line)
        place = rng.choice(self._places)
        first = rng.choice(self._first_names)
        if member == 0:
            title = family
        elif kind == "person":
            title = f"{first} {family}"
        else:
            title = f"{family} ({kind})"
        return Page(line, self.wikipedia_id(line), title, family, kind, place, first, size)

    def sentence(self, rng: random.Random, page: Page, words: int) -> str:
        """Common words mixed with the page kind's topic words (~30%) and, for one word in ten,
        a place name shared across the catalogue."""
        chosen = rng.choices(self._vocabulary[page.kind], k=words)
        for _ in range(words // 10):
            chosen[rng.randrange(words)] = rng.choice(self._places)
        return " ".join(chosen).capitalize() + "."

    def _paragraphs(self, rng: random.Random, page: Page) -> list[str]:
        drawn = rng.lognormvariate(math.log(self.lead_median_chars), LEAD_SIGMA)
        lead = min(max(drawn, LEAD_CHARS[0]), LEAD_CHARS[1])
        display = page.title.split(" (")[0]
        sentences = [f"{display} is a {page.kind} from {page.place}."]
        length = len(sentences[0])
        while length < lead:
            sentences.append(self.sentence(rng, page, rng.randint(8, 22)))
            length += len(sentences[-1]) + 1
        paragraphs, start = [], 0
        while start < len(sentences):
            stop = start + rng.randint(2, 5)
            paragraphs.append(" ".join(sentences[start:stop]) + "\n")
            start = stop
        if rng.random() < 1 / 3:
            paragraphs.append("Section::::History.\n")
            paragraphs += [f"BULLET::::- {self.sentence(rng, page, 6)}\n" for _ in range(2)]
        return paragraphs

    def page_line(self, line: int) -> str:
        """The knowledge-source line (JSON and newline) of ``line``."""
        page = self.page(line)
        rng = random.Random(self.seed * 1_000_039 + line)
        paragraphs = self._paragraphs(rng, page)
        anchor_target = rng.randrange(self.pages)
        record = {
            "_id": page.wikipedia_id,
            "wikipedia_id": page.wikipedia_id,
            "wikipedia_title": page.title,
            "text": [f"{page.title}\n", *paragraphs],
            "anchors": [
                {
                    "paragraph_id": 1,
                    "start": 0,
                    "end": len(page.title.split(" (")[0]),
                    "text": page.place,
                    "href": page.place,
                    "wikipedia_title": page.place,
                    "wikipedia_id": self.wikipedia_id(anchor_target),
                }
            ],
            "categories": f"{page.kind.capitalize()}s of {page.place}",
            "history": {
                "pageid": int(page.wikipedia_id),
                "parentid": 900_000_000 + line,
                "revid": 910_000_000 + line,
                "pre_dump": True,
                "timestamp": "2019-07-15T10:20:30Z",
                "url": f"https://en.wikipedia.org/w/index.php?title={page.title.replace(' ', '_')}",
            },
            "wikidata_info": {"wikidata_id": f"Q{1000 + line}", "wikipedia_title": page.title},
        }
        return json.dumps(record, ensure_ascii=False) + "\n"

    def gold(self, rng: random.Random) -> Page:
        """A page of a family of two or more (so that the family shares its surface form)."""
        while True:
            slot = rng.randrange(self.pages)
            line = self.line_of(slot)
            page = self.page(line)
            if page.family_size >= 2:
                return page

    def aida_line(self, split: str, number: int) -> str:
        """One AIDA KILT line: the gold named by its family token (or a person's full name),
        the context holding its kind's topic words and its place with some noise."""
        rng = random.Random(f"{self.seed}:{split}:{number}")
        page = self.gold(rng)
        mention = page.family
        if page.kind == "person" and rng.random() < 0.5:
            mention = f"{page.first_name} {page.family}"
        topic = KINDS[page.kind]
        left = f"{self.sentence(rng, page, rng.randint(10, 30))} In {page.place} the"
        right = f"{rng.choice(topic)} {self.sentence(rng, page, rng.randint(10, 30))}"
        record = {
            "id": f"{split}-{number}",
            "input": f"{left} [START_ENT] {mention} [END_ENT] {right}",
            "output": [
                {
                    "answer": page.title,
                    "provenance": [{"wikipedia_id": page.wikipedia_id, "title": page.title}],
                }
            ],
            "meta": {"left_context": left, "mention": mention, "right_context": right},
        }
        return json.dumps(record, ensure_ascii=False) + "\n"


def aida_file_name(split: str) -> str:
    return f"aidayago2-{split}-kilt.jsonl"


#: the records below are read against their schema (pydantic, strict: no other key, no coercion)
_RECORD_SCHEMA = ConfigDict(strict=True, extra="forbid")


class GeneratorParameters(TypedDict):
    """What the output is a function of: the parts' stamp, and ``parameters`` of
    ``generator.json``; ``lead_median_chars`` only where it is not the default."""

    __pydantic_config__ = _RECORD_SCHEMA
    version: int
    pages: int
    seed: int
    mentions: dict[str, int]
    part_lines: int
    lead_median_chars: NotRequired[int]


class GeneratedFile(TypedDict):
    __pydantic_config__ = _RECORD_SCHEMA
    bytes: int
    sha256: str


class GeneratorRecord(TypedDict):
    """``generator.json``, written last: the parameters, each file's size and SHA-256, and the
    seconds of each stage."""

    __pydantic_config__ = _RECORD_SCHEMA
    parameters: GeneratorParameters
    files: dict[str, GeneratedFile]
    seconds: dict[str, float]


_PARAMETERS = TypeAdapter(GeneratorParameters)
_RECORD = TypeAdapter(GeneratorRecord)


def _parameters(world: KiltWorld, mentions: dict[str, int], part_lines: int) -> GeneratorParameters:
    parameters: GeneratorParameters = {
        "version": GENERATOR_VERSION,
        "pages": world.pages,
        "seed": world.seed,
        "mentions": mentions,
        "part_lines": part_lines,
    }
    if world.lead_median_chars != LEAD_MEDIAN_CHARS:  # the default's records stay as they were
        parameters["lead_median_chars"] = world.lead_median_chars
    return parameters


def _write_part(world: KiltWorld, path: Path, lines: range) -> int:
    """Write one part of the knowledge source, published by rename; returns its pages."""
    with AtomicPath(path) as temporary, temporary.open("w", encoding="utf-8") as handle:
        for line in lines:
            handle.write(world.page_line(line))
    return len(lines)


def _parts(world: KiltWorld, parts_dir: Path, part_lines: int) -> list[tuple[Path, range]]:
    return [
        (parts_dir / f"part-{n:05d}.jsonl", range(start, min(start + part_lines, world.pages)))
        for n, start in enumerate(range(0, world.pages, part_lines))
    ]


def write_knowledge_source(
    world: KiltWorld, out: Path, parameters: GeneratorParameters, part_lines: int, workers: int = 1
) -> Path:
    """Write ``out/kilt_knowledgesource.json`` through restartable parts (module docstring),
    ``workers`` processes writing parts at once."""
    parts_dir = out / PARTS_DIR
    stamp = parts_dir / GENERATOR_FILE
    if stamp.is_file() and read_resumable(stamp, _PARAMETERS, "parts stamp") != parameters:
        shutil.rmtree(parts_dir)  # parts of another parameter set (or unreadable): start afresh
    parts_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(stamp, parameters)
    parts = _parts(world, parts_dir, part_lines)
    missing = [(path, lines) for path, lines in parts if not path.is_file()]
    with (
        progress_bar(total=world.pages, desc="kilt pages", unit=" pages") as progress,
        ProcessPoolExecutor(workers) as pool,
    ):
        progress.update(world.pages - sum(len(lines) for _, lines in missing))
        jobs = [pool.submit(_write_part, world, path, lines) for path, lines in missing]
        try:
            for job in as_completed(jobs):
                progress.update(job.result())
        except BaseException:
            pool.shutdown(cancel_futures=True)  # stop at the first failure; restart resumes
            raise
    target = out / KNOWLEDGE_SOURCE
    with AtomicPath(target) as temporary, temporary.open("wb") as handle:
        for path, _ in parts:
            with path.open("rb") as part:
                shutil.copyfileobj(part, handle, 1 << 22)
    shutil.rmtree(parts_dir)
    return target


def write_aida(world: KiltWorld, out: Path, split: str, count: int) -> Path:
    """Write ``out/aidayago2-<split>-kilt.jsonl`` with ``count`` mentions."""
    target = out / aida_file_name(split)
    with AtomicPath(target) as temporary, temporary.open("w", encoding="utf-8") as handle:
        for number in progress_bar(
            range(count), desc=f"aida {split}", unit=" mentions", leave=False
        ):
            handle.write(world.aida_line(split, number))
    return target


def generate_kilt_inputs(
    out: Path,
    pages: int = KILT_PAGES,
    seed: int = 0,
    mentions: dict[str, int] | None = None,
    part_lines: int = 250_000,
    workers: int = 1,
    lead_median_chars: int = LEAD_MEDIAN_CHARS,
) -> GeneratorRecord:
    """Write the knowledge source and AIDA files under ``out`` (module docstring); return
    ``generator.json``'s content: parameters, per-file bytes and SHA-256, seconds per stage.
    A finished run with the same parameters is kept as it is."""
    out = Path(out)
    mentions = dict(AIDA_MENTIONS if mentions is None else mentions)
    world = KiltWorld(pages, seed, lead_median_chars)
    parameters = _parameters(world, mentions, part_lines)
    done = out / GENERATOR_FILE
    if done.is_file():
        finished = read_resumable(done, _RECORD, "generator record")
        if finished is not None and finished["parameters"] == parameters:
            return finished
        done.unlink()
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    files = [write_knowledge_source(world, out, parameters, part_lines, workers)]
    seconds["knowledge source"] = time.perf_counter() - started
    for split, count in mentions.items():
        started = time.perf_counter()
        files.append(write_aida(world, out, split, count))
        seconds[f"aida {split}"] = time.perf_counter() - started
    record: GeneratorRecord = {
        "parameters": parameters,
        "files": {
            path.name: {"bytes": path.stat().st_size, "sha256": sha256_file(path)} for path in files
        },
        "seconds": seconds,
    }
    atomic_write_json(done, record)
    return record
