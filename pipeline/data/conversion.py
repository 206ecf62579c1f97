"""One conversion from input files to a published dataset directory (docs/stores.md, docs/failures.md).

Every converter (Zeshel, KILT, BLINK, WordNet, the synthetic worlds) runs inside one
:class:`Conversion`, which in this order, before any row is read:

1. checks every input path (all of them: a missing AIDA file is reported at once, not after
   hours of converting a 5.9M-line knowledge source) and that no file is given twice;
2. checks the rejects file: by default ``rejects.jsonl`` inside the dataset; a path given with
   ``--rejects`` must not exist yet, must not be or lie inside an input, and must not lie inside
   ``--out`` (which is replaced whole);
3. checks the output: an ``--out`` that holds anything is refused unless ``--overwrite``
   (:class:`hnce.cluster.stores.tables_write.DatasetBuilder`);
4. records every input with its SHA-256 for the manifest.

Then the converter writes through :attr:`Conversion.builder` and reports bad rows to
:attr:`Conversion.policy`; :meth:`Conversion.publish` adds the bad-row counts to the summary and
publishes the dataset by rename. On any error nothing of the conversion remains (the rejects file
it created included) and the old dataset at ``--out`` is untouched.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, TypeAdapter
from typing_extensions import TypedDict

from hnce.cluster.stores.tables import REJECTS_FILE
from hnce.cluster.stores.tables_read import EntityCatalogue
from hnce.cluster.stores.tables_write import DatasetBuilder
from hnce.errors import InputError
from hnce.pipeline.data.bad_rows import SKIP_HINT, BadRowKind, BadRowMode, BadRowPolicy

logger = logging.getLogger(__name__)


#: a summary's schema checks the keys its readers use (strict) and keeps the converter's own
#: counts as they are
_SUMMARY_KEYS = ConfigDict(strict=True, extra="allow")


class BadRowCounts(TypedDict):
    """A summary's ``bad_rows`` (:meth:`BadRowPolicy.summary`): the rows rejected, by kind."""

    __pydantic_config__ = _SUMMARY_KEYS
    rejected: dict[str, int]


class ConversionSummary(TypedDict):
    """A dataset's ``summary.json`` as :meth:`Conversion.publish` writes it: the converter's
    format and the bad-row counts (what readers use; the converter's other counts ride along)."""

    __pydantic_config__ = _SUMMARY_KEYS
    format: str
    bad_rows: BadRowCounts


#: what :func:`hnce.cluster.stores.tables_read.read_summary` reads a conversion's summary with
CONVERSION_SUMMARY = TypeAdapter(ConversionSummary)


class ConversionInputError(InputError):
    """An input, rejects or output path that a conversion cannot use."""


class EmptyCatalogueError(InputError):
    """No entity survived the conversion of the catalogue."""


@dataclass(frozen=True)
class DatasetOutput:
    """Where a converter publishes its dataset and what it does with bad rows (the options of
    every ``hnce data`` command)."""

    out: Path
    overwrite: bool = False
    on_bad_row: BadRowMode = "strict"
    rejects: Path | None = None
    skip_kinds: tuple[BadRowKind, ...] = ()


def _inside(path: Path, directory: Path) -> bool:
    return path == directory or directory in path.parents


def _check_inputs(inputs: Sequence[tuple[str, Path]], out: Path, overwrite: bool) -> None:
    missing = [f"{role} {path}" for role, path in inputs if not Path(path).exists()]
    if missing:
        raise ConversionInputError(f"input not found: {'; '.join(missing)}")
    for role, path in inputs:
        path = Path(path)
        if not (path.is_file() or path.is_dir()):
            raise ConversionInputError(
                f"{path}: the {role} input is not a regular file (a pipe or a device?); a "
                f"conversion reads its inputs twice (their SHA-256 for the manifest, then the "
                f"rows), so save it to a file first"
            )
        if overwrite and _inside(path.resolve(), out.resolve()):
            raise ConversionInputError(
                f"{path}: the {role} input lies inside --out {out}, which --overwrite replaces "
                f"whole; move the input out of it first"
            )
    seen: dict[Path, str] = {}
    for role, path in inputs:
        resolved = Path(path).resolve()
        if resolved in seen:
            raise ConversionInputError(f"{path}: given twice (as {seen[resolved]} and as {role})")
        seen[resolved] = role


def _check_rejects(rejects: Path, inputs: Sequence[tuple[str, Path]], out: Path) -> None:
    resolved = rejects.resolve()
    for role, path in inputs:
        if _inside(resolved, Path(path).resolve()):
            raise ConversionInputError(
                f"--rejects {rejects}: is the {role} input {path} (or inside it); rejects go to "
                "a new file"
            )
    if os.path.lexists(rejects):  # a dangling link too: rejects never write through a link
        raise ConversionInputError(
            f"--rejects {rejects}: already exists; rejects go to a new file (by default "
            f"{REJECTS_FILE} inside the dataset)"
        )
    if _inside(resolved, out.resolve()):
        raise ConversionInputError(
            f"--rejects {rejects}: lies inside --out {out}, which is replaced whole; leave "
            f"--rejects out to keep the rejects in the dataset"
        )


class Conversion:
    """The checks, dataset builder and bad-row policy of one conversion (module docstring).

    Args:
        output: the dataset to publish (a bare path: strict, no overwrite).
        converter: the converter's name, recorded in the manifest.
        version: the converter's version, recorded in the manifest.
        inputs: ``(role, path)`` of every input file, in reading order.
    """

    def __init__(
        self,
        output: DatasetOutput | Path,
        converter: str,
        version: int,
        inputs: Sequence[tuple[str, Path]],
    ) -> None:
        self.output = output if isinstance(output, DatasetOutput) else DatasetOutput(Path(output))
        out = Path(self.output.out)
        _check_inputs(inputs, out, self.output.overwrite)
        if self.output.rejects is not None:
            _check_rejects(Path(self.output.rejects), inputs, out)
        self.builder = DatasetBuilder(out, converter, version, self.output.overwrite)
        self.seconds: dict[str, float] = {}
        self.rejects_published = self.output.rejects or out / REJECTS_FILE
        self.policy = BadRowPolicy(
            self.output.on_bad_row,
            self.output.rejects or self.builder.root / REJECTS_FILE,
            self.output.skip_kinds,
            hint=SKIP_HINT,
        )
        files = [(role, Path(path)) for role, path in inputs if Path(path).is_file()]
        logger.info(
            "hashing %d input file(s), %.1f MB",
            len(files),
            sum(path.stat().st_size for _, path in files) / 1e6,
        )
        try:
            with self.stage("hash inputs"):
                for role, path in files:
                    self.builder.add_input(role, path)
        except BaseException:
            self.builder.abort()
            raise

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time one stage of the conversion: logged, and in the summary's ``seconds``."""
        started = time.perf_counter()
        yield
        self.seconds[name] = time.perf_counter() - started
        logger.info("%s: %.1f s", name, self.seconds[name])

    def catalogue(self) -> EntityCatalogue:
        """The catalogue just written; an empty one is an error (in skip mode too), reported
        before any mention is read so that the mentions are not blamed for it."""
        catalogue = self.builder.catalogue()
        if len(catalogue) == 0:
            rejected = {kind: n for kind, n in self.policy.counts.items() if n}
            raise EmptyCatalogueError(
                f"{self.output.out}: no entity was converted "
                f"(rejected rows: {rejected or 'none'}); check the catalogue input"
            )
        return catalogue

    def publish(self, summary: dict[str, Any]) -> dict[str, Any]:
        """Add the bad-row counts and stage timings to ``summary``, publish the dataset, return
        the summary (whose ``seconds`` then also holds the publishing itself)."""
        self.policy.close()
        bad_rows = self.policy.summary()
        if bad_rows["rejects_file"] is not None:
            bad_rows["rejects_file"] = str(self.rejects_published)
        summary = {**summary, "bad_rows": bad_rows, "seconds": dict(self.seconds)}
        CONVERSION_SUMMARY.validate_python(summary)  # what its readers will accept
        with self.stage("publish (hash and rename)"):
            self.builder.publish(summary)
        return {**summary, "seconds": dict(self.seconds)}

    def __enter__(self) -> Conversion:
        return self

    def __exit__(self, *_: object) -> None:
        """Close the rejects file and, unless the dataset was published, remove all the
        conversion wrote, also when closing the rejects file fails (a full disk refusing its
        last lines)."""
        try:
            self.policy.close()
        finally:
            if self.builder.published is None:
                if self.output.rejects is not None:
                    Path(self.output.rejects).unlink(missing_ok=True)
                self.builder.abort()  # raises a failed writer's error again: the first one
