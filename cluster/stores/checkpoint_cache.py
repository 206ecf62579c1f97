"""The negative cache's rows a checkpoint keeps: ``step-<S>/deepspeed/negative_cache.safetensors``
(:data:`~hnce.cluster.stores.checkpoints.NEGATIVE_CACHE_FILE`; docs/stores.md, "Checkpoints").

A checkpoint of a run with ``negatives.cache`` keeps the rows training steps wrote since the
cache was last filled (:meth:`hnce.mining.negative_cache.NegativeCache.written_rows`), so that a
resumed worker draws what an uninterrupted one would. The file holds three tensors::

    rows        int64 [R]        row numbers of the cache, each once, in 0 .. rows - 1
    vectors     float [R, b, d]  the rows' reduced entity vectors (b vectors an entity, width d)
    written_at  int64 [R]        the optimizer step that wrote each, in 0 .. S

:func:`write_cache_rows` writes it and :func:`read_cache_rows` is the one reader: the checkpoint's
manifest says the file is the one written, and the reader that it is one the cache can take
(readable, those three tensors of those dtypes and shapes, rows inside the cache and unique,
finite vectors, steps no later than the checkpoint). Every failure is a
:class:`~hnce.cluster.stores.checkpoints.CheckpointIntegrityError` naming the file, and the row
where there is one: a resumed worker never trains on a NaN or crashes inside safetensors.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from hnce.cluster.stores.checkpoints import (
    DEEPSPEED_DIR,
    NEGATIVE_CACHE_FILE,
    CheckpointIntegrityError,
)
from hnce.cluster.stores.files import AtomicPath
from hnce.mining.negative_cache import CachedRows

_TENSORS = ("rows", "vectors", "written_at")


def cache_rows_path(checkpoint: Path) -> Path:
    """Where checkpoint directory ``checkpoint`` keeps its negative cache's rows."""
    return Path(checkpoint) / DEEPSPEED_DIR / NEGATIVE_CACHE_FILE


def write_cache_rows(checkpoint: Path, kept: CachedRows, filled_version: int) -> Path:
    """Keep ``kept`` in ``checkpoint`` (beside its DeepSpeed state, before its manifest is
    signed), with the index version the cache was last filled from; returns the file."""
    path = cache_rows_path(checkpoint)
    tensors = {"rows": kept.rows, "vectors": kept.vectors, "written_at": kept.written_at}
    with AtomicPath(path) as temporary:  # a write the machine refuses names the file
        save_file(tensors, str(temporary), metadata={"filled_version": str(filled_version)})
    return path


def read_cache_rows(checkpoint: Path, shape: tuple[int, int, int], step: int) -> CachedRows | None:
    """The rows checkpoint ``checkpoint`` of optimizer step ``step`` kept for a cache of
    ``shape`` (rows, vectors an entity, width), checked (module docs); None when it kept none
    (a run without the cache). Verify the checkpoint against its manifest first."""
    path = cache_rows_path(checkpoint)
    if not path.is_file():
        return None
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError) as error:
        raise CheckpointIntegrityError(f"{path}: not a safetensors file ({error})") from None
    missing = [name for name in _TENSORS if name not in tensors]
    extra = sorted(set(tensors) - set(_TENSORS))
    if missing or extra:
        raise CheckpointIntegrityError(
            f"{path}: expected the tensors {', '.join(_TENSORS)}; "
            + (f"missing {', '.join(missing)}" if missing else f"unexpected {', '.join(extra)}")
        )
    kept = CachedRows(tensors["rows"], tensors["vectors"], tensors["written_at"])
    _check_rows(kept.rows, shape[0], path)
    _check_vectors(kept, shape, path)
    _check_steps(kept.written_at, len(kept.rows), step, path)
    return kept


def _check_rows(rows: Tensor, num_rows: int, path: Path) -> None:
    """int64 [R] row numbers, each a row of the cache, each once."""
    if rows.dtype != torch.int64 or rows.dim() != 1:
        raise CheckpointIntegrityError(
            f"{path}: rows must be int64 [R], got {rows.dtype} {list(rows.shape)}"
        )
    outside = ((rows < 0) | (rows >= num_rows)).nonzero().flatten()
    if len(outside):
        at = int(outside[0])
        raise CheckpointIntegrityError(
            f"{path}: rows[{at}] is {int(rows[at])}, outside the cache's rows 0..{num_rows - 1} "
            f"(one an entity of the training mentions' domains)"
        )
    ordered, order = torch.sort(rows, stable=True)
    twice = (ordered[1:] == ordered[:-1]).nonzero().flatten()
    if len(twice):
        first, again = (int(order[int(twice[0]) + offset]) for offset in (0, 1))
        raise CheckpointIntegrityError(
            f"{path}: row {int(rows[first])} is kept twice (rows[{first}] and rows[{again}])"
        )


def _check_vectors(kept: CachedRows, shape: tuple[int, int, int], path: Path) -> None:
    """Floating vectors [R, b, d] of the cache's b and d, one per row, all finite."""
    vectors, expected = kept.vectors, [len(kept.rows), *shape[1:]]
    if not vectors.is_floating_point() or list(vectors.shape) != expected:
        raise CheckpointIntegrityError(
            f"{path}: vectors must be floating point of shape {expected} ({len(kept.rows)} rows, "
            f"{shape[1]} vector(s) an entity of width {shape[2]}), got {vectors.dtype} "
            f"{list(vectors.shape)}"
        )
    broken = (~torch.isfinite(vectors.flatten(1)).all(dim=1)).nonzero().flatten()
    if len(broken):
        at = int(broken[0])
        raise CheckpointIntegrityError(
            f"{path}: the vectors of row {int(kept.rows[at])} (rows[{at}]) are not finite (NaN "
            f"or infinite); refusing to train on them"
        )


def _check_steps(written_at: Tensor, count: int, step: int, path: Path) -> None:
    """int64 [R] steps, each one a step up to the checkpoint's could have written."""
    if written_at.dtype != torch.int64 or list(written_at.shape) != [count]:
        raise CheckpointIntegrityError(
            f"{path}: written_at must be int64 [{count}] (a step for each row), got "
            f"{written_at.dtype} {list(written_at.shape)}"
        )
    outside = ((written_at < 0) | (written_at > step)).nonzero().flatten()
    if len(outside):
        at = int(outside[0])
        raise CheckpointIntegrityError(
            f"{path}: written_at[{at}] is step {int(written_at[at])}, outside the steps 0..{step} "
            f"that wrote this checkpoint's rows"
        )
