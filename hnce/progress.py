"""How long work reports its progress, decided once per process (docs/architecture.md).

Every loop that takes long (encoding the catalogue, mining, evaluation, the token store, the
trainer's driver) makes its bar with :func:`progress_bar`, a ``tqdm`` that shows what this
process was told to show, with nothing threaded through the call chain:

- a bar redrawn in place when standard error is a terminal;
- one log line (logger ``hnce.progress``) every :data:`LOG_SECONDS` and a last one at the end
  when it is not (a log file, ``ray job`` logs, CI), instead of a carriage-return bar redrawn
  every second;
- nothing at all inside :func:`quiet` (``--no-progress``, tests, the encoder actors).

Example::

    with quiet():                                  # e.g. the CLI's --no-progress
        for batch in progress_bar(batches, desc="encode", unit="batch"):
            ...
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from tqdm import tqdm

LOG_SECONDS = 30.0
_LOG_FORMAT = "{desc}: {n_fmt}/{total_fmt} {unit} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
logger = logging.getLogger("hnce.progress")
Item = TypeVar("Item")

_shown = True


class _LogLines:
    """A file for tqdm that logs each status line it writes (without the carriage returns)."""

    def write(self, text: str) -> None:
        line = text.strip("\r\n ")
        if line:
            logger.info("%s", line)

    def flush(self) -> None:
        """Lines are logged as they are written."""


@contextmanager
def quiet(enabled: bool = True) -> Iterator[None]:
    """No progress from this process inside the block (``quiet(False)``: leave it as it is)."""
    global _shown
    before = _shown
    _shown = before and not enabled
    try:
        yield
    finally:
        _shown = before


def progress_bar(
    iterable: Iterable[Item] | None = None,
    *,
    total: float | None = None,
    desc: str = "",
    unit: str = "it",
    **options: Any,
) -> tqdm:
    """A ``tqdm`` over ``iterable`` (or updated by hand up to ``total``), shown as this process
    shows progress (module docstring); ``options`` go to ``tqdm`` (e.g. ``unit_scale``)."""
    if not _shown:
        return tqdm(iterable, total=total, disable=True)
    if sys.stderr.isatty():
        return tqdm(iterable, total=total, desc=desc, unit=unit, **options)
    return tqdm(
        iterable,
        total=total,
        desc=desc,
        unit=unit,
        file=_LogLines(),
        mininterval=LOG_SECONDS,
        bar_format=_LOG_FORMAT,
        **options,
    )
