"""Typed fields of input rows, read the same way by every converter.

Keys (Wikipedia ids, Zeshel document and mention ids, AIDA ids) are compared as the source writes
them: a JSON string is whitespace-stripped and kept as written (``"0100"`` stays ``"0100"``, never
``100``; Arabic-Indic digits stay themselves), a JSON integer becomes its decimal string, and
anything else (``true``, ``1.5``, an object, a list) is an ``invalid_key`` bad row rather than a
key such as ``"True"``. Both sides of a look-up (the catalogue's key and a mention's reference to
it) go through :func:`source_key`, so ``" 100 "`` and ``100`` name the same entity everywhere.

Duplicate keys are found by :class:`KeySet`, which holds 8 bytes per key (a 5.9M-page knowledge
source: ~50 MB instead of a ~350 MB Python set).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import replace

import numpy as np

from hnce.cluster.stores.tables import Entity
from hnce.cluster.stores.tables_write import EntityCatalogueWriter
from hnce.pipeline.data.bad_rows import BadRowKind, BadRowPolicy, InputRow


def source_key(row: InputRow, policy: BadRowPolicy, name: str, value: object) -> str | None:
    """The key in field ``name`` of ``row`` as the source wrote it (see the module docstring),
    or None after reporting an ``invalid_key`` or ``empty_key`` bad row."""
    if isinstance(value, str):
        key = value.strip()
    elif isinstance(value, int) and not isinstance(value, bool):
        key = str(value)
    else:
        row.reject(
            policy,
            BadRowKind.INVALID_KEY,
            f"{name} is a {type(value).__name__} ({value!r}), not a string or an integer",
        )
        return None
    if not key:
        row.reject(policy, BadRowKind.EMPTY_KEY, f"empty {name}")
        return None
    return key


def text_field(row: InputRow, policy: BadRowPolicy, name: str) -> str | None:
    """The string in field ``name`` of ``row`` (present: see :meth:`InputRow.require`), or None
    after reporting a ``missing_field`` bad row when it is not a string."""
    value = row.record.get(name)
    if not isinstance(value, str):
        row.reject(
            policy, BadRowKind.MISSING_FIELD, f"{name} is a {type(value).__name__}, not a string"
        )
        return None
    return value


def key_and_title(
    row: InputRow, policy: BadRowPolicy, required: Sequence[str], key: str, title: str
) -> tuple[str, str] | None:
    """The key and title of a catalogue row that has every ``required`` field; None after
    reporting the first bad field (one reject per row)."""
    if not row.require(policy, required):
        return None
    found = source_key(row, policy, key, row.record[key])
    if found is None:
        return None
    text = text_field(row, policy, title)
    return None if text is None else (found, text)


class KeySet:
    """The keys seen so far, as sorted runs of 64-bit fingerprints (Python's string hash, fixed
    within a process), merged like a log-structured merge tree so that adding n keys costs
    O(n log n) in all and a look-up one binary search per run.

    Two different keys with the same fingerprint would be taken for a duplicate; with n keys the
    chance is about n² / 2⁶⁵ (10⁻⁶ for all 5.9M Wikipedia pages).
    """

    def __init__(self) -> None:
        self._runs: list[np.ndarray] = []

    def add_new(self, keys: Sequence[str]) -> np.ndarray:
        """Add ``keys`` in order; True for each key seen neither before nor earlier in ``keys``."""
        fingerprints = np.fromiter(map(hash, keys), np.int64, len(keys))
        fresh = np.zeros(len(keys), dtype=bool)
        fresh[np.unique(fingerprints, return_index=True)[1]] = True
        for run in self._runs:
            at = np.minimum(np.searchsorted(run, fingerprints), len(run) - 1)
            fresh &= run[at] != fingerprints
        run = np.sort(fingerprints[fresh])
        while self._runs and len(self._runs[-1]) <= 2 * len(run):
            run = np.sort(np.concatenate([self._runs.pop(), run]))
        if len(run):
            self._runs.append(run)
        return fresh

    def add(self, key: str) -> bool:
        """Add one key; True when it is new."""
        return bool(self.add_new([key])[0])


def write_unique_entities(
    rows: Iterable[tuple[InputRow, Entity]],
    writer: EntityCatalogueWriter,
    keys: KeySet,
    policy: BadRowPolicy,
    key_name: str,
) -> list[Entity]:
    """Write a chunk of valid catalogue rows in order, each with the next dense entity_id, and
    return what was written; a row whose key was written before (in this chunk or an earlier
    one) is a ``duplicate_key``."""
    pending = list(rows)
    fresh = keys.add_new([entity.key for _, entity in pending])
    written = []
    for (row, entity), is_new in zip(pending, fresh, strict=True):
        if not is_new:
            row.reject(policy, BadRowKind.DUPLICATE_KEY, f"duplicate {key_name} {entity.key!r}")
            continue
        written.append(replace(entity, entity_id=writer.count))
        writer.write(written[-1])
    return written


#: train / dev / test shares of :func:`hashed_split`
SPLIT_FRACTIONS = (0.8, 0.1, 0.1)


def hashed_split(name: str, seed: int) -> str:
    """``train``, ``dev`` or ``test`` (80 / 10 / 10) by a seeded hash of ``name``: whatever shares a
    name (a WordNet lemma's mentions, the links of one FOLDOC entry) lands in one split."""
    digest = hashlib.blake2b(f"{seed}\x00{name}".encode(), digest_size=8).digest()
    fraction = int.from_bytes(digest, "big") / 2**64
    if fraction < SPLIT_FRACTIONS[0]:
        return "train"
    return "dev" if fraction < SPLIT_FRACTIONS[0] + SPLIT_FRACTIONS[1] else "test"
