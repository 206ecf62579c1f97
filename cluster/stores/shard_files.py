"""The files of one shard of an index version (docs/stores.md): written by whoever encodes the
shard (the encoder actors, :func:`write_shard`), verified and memory-mapped by whoever searches it
(:func:`read_shard`).

A shard is ``shard-<n>.faiss`` (its FAISS index), ``shard-<n>.ids.npy`` (the int64 entity id of
each vector) and, for a compressed shard, ``shard-<n>.codes.npy`` (a sum-of-max shard's standalone
token codes) or ``shard-<n>.vectors.npy`` (a float16 copy of its vectors); a build's
``quantiser.faiss`` is the trained, empty IVF-PQ index all its shards share. Each file is written
through a temporary sibling and renamed (`hnce.cluster.stores.files`); its SHA-256 goes into the
shard's :class:`ShardRecord`, which the version's manifest lists (`hnce.cluster.stores.index_store`).
Nothing read is trusted: every file is checked against its checksum, then its content (shape,
dtype, ids inside the shard's range, codes' centroids inside their quantiser, finite vectors),
by the one reader every process uses (:func:`read_shard`), and every failure is a `StoreError`
naming the file (and row).
"""

from __future__ import annotations

from pathlib import Path
from tokenize import TokenError

import faiss
import numpy as np

from hnce.cluster.stores.faiss_device import FaissDevice
from hnce.cluster.stores.files import AtomicPath, sha256_file
from hnce.cluster.stores.index_shard import IndexShard, stored_count
from hnce.cluster.stores.index_spec import IndexKind
from hnce.cluster.stores.plaid import centroid_ids, read_plaid_index
from hnce.cluster.stores.versioned_dir import (
    Count,
    Sha256,
    StoreError,
    confined_path,
    verify_sha256,
)
from hnce.documents import document_record

#: an ivfpq build's trained, empty IVF-PQ index, shared by all its shards
QUANTISER_FILE = "quantiser.faiss"
#: rows of a shard's codes or vector copy checked in one block (16 MiB of centroid ids)
_ROWS_CHECKED_AT_ONCE = 1 << 21


@document_record
class ShardRecord:
    """One shard of a version, as recorded in the manifest: its files, their SHA-256, its vector
    count and the entity range [start, stop) it covers; `codes` (and its SHA-256) only for a
    compressed sum-of-max shard, `vectors` (and its SHA-256) only for a compressed multi-m
    shard."""

    file: str
    ids: str
    sha256: Sha256
    ids_sha256: Sha256
    count: Count
    entities: tuple[Count, Count]
    codes: str | None = None
    codes_sha256: Sha256 | None = None
    vectors: str | None = None
    vectors_sha256: Sha256 | None = None

    def files(self) -> list[tuple[str, str | None]]:
        """(name, SHA-256) of each file of the shard: its index, its ids and a compressed
        shard's codes or vector copy; what taking a version over or exporting it carries."""
        listed = [
            (self.file, self.sha256),
            (self.ids, self.ids_sha256),
            (self.codes, self.codes_sha256),
            (self.vectors, self.vectors_sha256),
        ]
        return [(name, digest) for name, digest in listed if name is not None]


#: the FAISS class a shard of each index kind is (``faiss_index.train_index`` builds them)
_INDEX_CLASSES: dict[str, type] = {
    "flat": faiss.IndexFlat,
    "hnsw": faiss.IndexHNSW,
    "ivfpq": faiss.IndexIVFPQ,
    "plaid": faiss.IndexIVFPQ,
}


def shard_file_names(shard_no: int) -> tuple[str, str, str, str]:
    """(index file, ids file, codes file, vector copy file) of shard `shard_no`."""
    stem = f"shard-{shard_no:05d}"
    return f"{stem}.faiss", f"{stem}.ids.npy", f"{stem}.codes.npy", f"{stem}.vectors.npy"


def check_shard_ids(
    ids: np.ndarray, entities: tuple[int, int], vectors_per_entity: int | None, path: Path
) -> None:
    """A shard's ids are int64, within [start, stop), and cover each entity of the range: exactly
    once (dual), m times in a row (multi-m) or at least once, in order (sum-of-max)."""
    start, stop = entities
    if ids.dtype != np.int64 or ids.ndim != 1:
        raise StoreError(f"{path}: expected a 1-d int64 id array, got {ids.dtype} {ids.shape}")
    if len(ids) and (int(ids.min()) < start or int(ids.max()) >= stop):
        raise StoreError(
            f"{path}: entity ids {int(ids.min())}..{int(ids.max())} outside this shard's range "
            f"{start}..{stop - 1}"
        )
    if vectors_per_entity is not None:
        expected = np.repeat(np.arange(start, stop, dtype=np.int64), vectors_per_entity)
        if not np.array_equal(ids, expected):
            raise StoreError(
                f"{path}: ids must list each entity of {start}..{stop - 1} exactly "
                f"{vectors_per_entity} time(s), in order"
            )
        return
    steps = np.diff(ids)
    if (
        len(ids) == 0
        or ids[0] != start
        or ids[-1] != stop - 1
        or ((steps != 0) & (steps != 1)).any()
    ):
        raise StoreError(
            f"{path}: ids must cover every entity of {start}..{stop - 1} in order, at least once"
        )


def write_shard(
    directory: Path,
    shard_no: int,
    index: faiss.Index,
    ids: np.ndarray,
    entities: tuple[int, int],
    vectors_per_entity: int | None,
    codes: np.ndarray | None = None,
    vectors: np.ndarray | None = None,
) -> ShardRecord:
    """Write shard `shard_no` (a CPU index, its int64 entity ids and, for a compressed shard,
    its token codes or its float16 vector copy) into a version directory; returns its manifest
    record. Encoder actors call this; retried, it writes the same bytes."""
    directory = Path(directory)
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    file_name, ids_name, codes_name, vectors_name = shard_file_names(shard_no)
    count = stored_count(index, codes)
    if len(ids) != count:
        raise ValueError(f"shard {shard_no}: {count} vectors but {len(ids)} ids")
    check_shard_ids(ids, entities, vectors_per_entity, directory / ids_name)
    index_path, ids_path = directory / file_name, directory / ids_name
    with AtomicPath(index_path) as temporary:
        write_index_file(index, temporary)
    _save_array(ids_path, ids)
    codes_sha256 = None
    if codes is not None:
        check_shard_codes(codes, index, count, directory / codes_name)
        _save_array(directory / codes_name, codes)
        codes_sha256 = sha256_file(directory / codes_name)
    vectors_sha256 = None
    if vectors is not None:
        check_shard_vectors(vectors, index, count, directory / vectors_name)
        _save_array(directory / vectors_name, vectors)
        vectors_sha256 = sha256_file(directory / vectors_name)
    return ShardRecord(
        file=file_name,
        ids=ids_name,
        sha256=sha256_file(index_path),
        ids_sha256=sha256_file(ids_path),
        count=count,
        entities=(int(entities[0]), int(entities[1])),
        codes=None if codes is None else codes_name,
        codes_sha256=codes_sha256,
        vectors=None if vectors is None else vectors_name,
        vectors_sha256=vectors_sha256,
    )


def write_quantiser(directory: Path, index: faiss.Index) -> Path:
    """Write a build's trained quantiser (an empty IVF-PQ index) into its directory, atomically:
    a build interrupted while training finds none and trains again."""
    path = Path(directory) / QUANTISER_FILE
    with AtomicPath(path) as temporary:
        write_index_file(index, temporary)
    return path


def read_quantiser(directory: Path) -> faiss.Index:
    """A build's trained quantiser, as :func:`write_quantiser` wrote it into `directory`
    (StoreError naming the file when it is not one, or holds vectors)."""
    path = Path(directory) / QUANTISER_FILE
    try:
        index = faiss.read_index(str(path))
    except RuntimeError as error:
        raise StoreError(f"{path}: not a FAISS index ({error})") from None
    if not index.is_trained or index.ntotal:
        raise StoreError(f"{path}: expected a trained, empty quantiser, got {index.ntotal} vectors")
    return index


def write_index_file(index: faiss.Index, path: Path) -> None:
    """Write ``index`` to ``path`` through a Python file: a write the machine refuses (a full
    disk) is then the ``OSError`` itself, with its errno, where ``faiss.write_index(index,
    filename)`` said only a RuntimeError's text."""
    with Path(path).open("wb") as handle:
        faiss.write_index(index, faiss.PyCallbackIOWriter(handle.write))


def read_index_file(path: Path, kind: IndexKind) -> faiss.Index:
    """A shard's FAISS index, memory-mapped where FAISS allows it (a plaid shard's is read once
    a process, `hnce.cluster.stores.plaid.read_plaid_index`).

    Flat and HNSW storage is mapped from the file (`IO_FLAG_MMAP_IFC`: the vectors stay in the page
    cache, shared and evictable, instead of a private copy); IVF-PQ maps its inverted lists
    (`IO_FLAG_MMAP`). The mapping outlives the file's removal by retention.
    """
    flag = faiss.IO_FLAG_MMAP if kind in ("ivfpq", "plaid") else faiss.IO_FLAG_MMAP_IFC
    return faiss.read_index(str(path), flag)


def _load_array(path: Path, what: str) -> np.ndarray:
    """A shard's ``.npy`` array, memory-mapped (StoreError naming `path` if it is not one)."""
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, EOFError, SyntaxError, TokenError) as error:  # empty; a header not Python
        raise StoreError(f"{path}: not a .npy {what} array ({error or 'empty'})") from None


def _save_array(path: Path, array: np.ndarray) -> None:
    with AtomicPath(path) as temporary, open(temporary, "wb") as handle:
        np.save(handle, array, allow_pickle=False)


def check_shard_codes(codes: np.ndarray, index: faiss.Index, count: int, path: Path) -> None:
    """A compressed token shard's codes: uint8, one row of the index's standalone code size per
    vector of its `count`, each row's centroid id one of its quantiser's ``nlist`` (StoreError
    naming `path` and the row otherwise). Any byte is a valid product code, so the centroid ids
    are all a file's content can be checked by: a quantiser of exactly 256 or 65,536
    centroids leaves none invalid."""
    expected = (count, index.sa_code_size())
    if codes.dtype != np.uint8 or codes.shape != expected:
        raise StoreError(
            f"{path}: expected uint8 codes of shape {expected} (one per token vector of "
            f"{count}), got {codes.dtype} {codes.shape}"
        )
    ivf = faiss.extract_index_ivf(index)
    for start in range(0, count, _ROWS_CHECKED_AT_ONCE):  # memory-mapped: a block at a time
        centroids = centroid_ids(codes[start : start + _ROWS_CHECKED_AT_ONCE], ivf)
        past = np.flatnonzero(centroids >= ivf.nlist)
        if len(past):
            row = start + int(past[0])
            raise StoreError(
                f"{path}: row {row} places its token in centroid {int(centroids[past[0]])}, but "
                f"the quantiser has {ivf.nlist} (0..{ivf.nlist - 1})"
            )


def check_shard_vectors(vectors: np.ndarray, index: faiss.Index, count: int, path: Path) -> None:
    """A compressed shard's vector copy: float16, one row of the index's width per vector of its
    `count`, every one finite (StoreError naming `path` and the row otherwise)."""
    expected = (count, index.d)
    if vectors.dtype != np.float16 or vectors.shape != expected:
        raise StoreError(
            f"{path}: expected a float16 vector copy of shape {expected}, got {vectors.dtype} "
            f"{vectors.shape}"
        )
    exponent = np.uint16(0x7C00)  # float16's exponent bits: all set in NaN and ±inf alone
    for start in range(0, count, _ROWS_CHECKED_AT_ONCE):  # memory-mapped: a block at a time
        bits = vectors[start : start + _ROWS_CHECKED_AT_ONCE].view(np.uint16)
        finite = ((bits & exponent) != exponent).all(axis=1)  # np.isfinite: 4x slower on float16
        if not finite.all():
            row = start + int(np.argmin(finite))
            raise StoreError(f"{path}: row {row} is not finite (NaN or infinite)")


def read_shard(
    directory: Path,
    number: int,
    record: ShardRecord,
    manifest_path: Path,
    *,
    vectors_per_entity: int | None,
    kind: IndexKind,
    dim: int,
    device: FaissDevice,
    verify: bool = True,
) -> IndexShard:
    """Shard `number` (its manifest `record`) of the version in `directory`, whose manifest
    `manifest_path` records index `kind` and vectors of width `dim`: files checked against their
    SHA-256 (streamed, with `verify`), then their content: ids against the shard's entity range
    and count, codes against their quantiser (:func:`check_shard_codes`), a vector copy's shape
    and finiteness; the FAISS index memory-mapped and placed on `device`. The one reader of a
    shard, in the driver and in every shard holder."""
    index_path = confined_path(directory, record.file, manifest_path)
    ids_path = confined_path(directory, record.ids, manifest_path)
    codes_path, vectors_path = (
        None if name is None else confined_path(directory, name, manifest_path)
        for name in (record.codes, record.vectors)
    )
    if verify:
        verify_sha256(index_path, record.sha256, manifest_path)
        verify_sha256(ids_path, record.ids_sha256, manifest_path)
        if codes_path is not None:
            verify_sha256(codes_path, str(record.codes_sha256), manifest_path)
        if vectors_path is not None:
            verify_sha256(vectors_path, str(record.vectors_sha256), manifest_path)
    ids = _load_array(ids_path, "id")
    check_shard_ids(ids, record.entities, vectors_per_entity, ids_path)
    if len(ids) != record.count:
        raise StoreError(f"{ids_path}: {len(ids)} ids, but {manifest_path} records {record.count}")
    try:
        index = (
            read_plaid_index(index_path, record.sha256)
            if kind == "plaid"
            else read_index_file(index_path, kind)
        )
    except RuntimeError as error:  # FAISS's own check of the file's header and structure
        reason = str(error).strip().splitlines()[-1]
        raise StoreError(f"{index_path}: not a FAISS index FAISS can read ({reason})") from None
    if not isinstance(index, _INDEX_CLASSES[kind]):
        raise StoreError(
            f"{index_path}: a FAISS {type(index).__name__}, but {manifest_path} records {kind}"
        )
    copy = codes = None
    if codes_path is not None:  # before the count: a plaid shard's vectors are its codes' rows
        codes = _load_array(codes_path, "code")
        check_shard_codes(codes, index, record.count, codes_path)
    count = stored_count(index, codes)
    if count != record.count or index.d != dim:
        raise StoreError(
            f"{index_path}: {count} vectors of dim {index.d}, but {manifest_path} "
            f"records {record.count} of dim {dim}"
        )
    if (
        codes is None
        and vectors_per_entity is None
        and vectors_path is None
        and not isinstance(index, faiss.IndexFlat)
    ):
        raise StoreError(
            f"{manifest_path}: sum-of-max shard {number} is {kind} without token codes or a "
            f"token copy to rescore from"
        )
    if vectors_path is not None:
        copy = _load_array(vectors_path, "vector")
        check_shard_vectors(copy, index, count, vectors_path)
    return IndexShard.on_device(index, ids, device, codes, copy)
