"""One timer for every benchmark: the wall seconds of a stage, and the best of N repeats.

Wall seconds come from :func:`time.perf_counter`; :attr:`Timer.epoch` is the same start on the
:func:`time.time` clock, for comparing with the timestamps of hnce's event logs. On a shared
machine the least of several repeats is the figure least disturbed by other work, and repeats of
two things being compared are alternated so that both see the same drift in the machine's load.

Example::

    with Timer() as timer:
        run_training(config)
    print(f"{timer.seconds:.1f} s")

    seconds = alternated_best({"flat": flat_search, "sharded": sharded_search}, repeats=3)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class Timer:
    """Wall seconds since it started (at creation, or on entering ``with``): :meth:`elapsed`
    while it runs, :attr:`seconds` once stopped (leaving ``with`` or :meth:`stop`)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.start()

    def start(self) -> Timer:
        """(Re)start: :attr:`epoch` is the start on the wall clock (``time.time()``)."""
        self.epoch = time.time()
        self._started = time.perf_counter()
        return self

    def elapsed(self) -> float:
        """Seconds since the start, the timer still running."""
        return time.perf_counter() - self._started

    def stop(self) -> float:
        """Stop: :attr:`seconds` is the time since the start; returns it."""
        self.seconds = self.elapsed()
        return self.seconds

    def __enter__(self) -> Timer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def timed(function: Callable[..., T], *args: Any, **kwargs: Any) -> tuple[T, float]:
    """``function(*args, **kwargs)``'s result and the wall seconds it took."""
    with Timer() as timer:
        result = function(*args, **kwargs)
    return result, timer.seconds


def best_of(function: Callable[[], object], repeats: int) -> float:
    """The least wall seconds of ``repeats`` calls of ``function``."""
    return min(timed(function)[1] for _ in range(max(1, repeats)))


def alternated_best(
    functions: Mapping[str, Callable[[], object]], repeats: int
) -> dict[str, float]:
    """The least wall seconds of each of ``functions`` (name: callable) over ``repeats`` rounds,
    each round calling every function once in turn."""
    times: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(max(1, repeats)):
        for name, function in functions.items():
            times[name].append(timed(function)[1])
    return {name: min(values) for name, values in times.items()}
