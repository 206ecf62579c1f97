"""The benchmark harness: what every benchmark in ``benchmarks/`` shares, each piece in one place.

- :mod:`~benchmarks.harness.arguments`: the command line (``--output``, ``--output-dir``,
  ``--nice``, the work directory and sizes under one spelling).
- :mod:`~benchmarks.harness.timing`: one timer (:class:`Timer`: the wall seconds of a stage),
  the best of N repeats (:func:`best_of`, :func:`alternated_best`).
- :mod:`~benchmarks.harness.memory`: peak resident memory, one way (each process's kernel
  high-water mark), per process role over the benchmark's process tree, Ray workers included
  (:class:`PeakMemory`), or inside this process (:func:`own_peak_bytes`).
- :mod:`~benchmarks.harness.commands`: a real command in a measured child process
  (:func:`run_command`, :func:`run_hnce`).
- :mod:`~benchmarks.harness.stages`: resumable stages in an atomically written state file
  (:class:`StageState`, :func:`run_stages`).
- :mod:`~benchmarks.harness.results`: result files, written atomically with the commit and
  command they were measured with (:func:`write_result`, :func:`write_measures`,
  :func:`write_json`, :func:`plot`); ``python -m benchmarks.report`` assembles BENCHMARKS.md.

Example (a whole benchmark; run it as ``python -m benchmarks.example --entities 1000``)::

    from benchmarks import harness

    def main() -> None:
        parser = harness.arguments(__doc__, "example", entities=200_000, repeats=3)
        args = harness.parse(parser)
        index = build_index(args.entities)
        seconds = harness.best_of(lambda: index.search(queries, 10), args.repeats)
        harness.write_measures(
            args.output, "Example", "CPU only.", [("queries/s", f"{len(queries) / seconds:.1f}")]
        )
"""

from benchmarks.harness.arguments import arguments, invocation, parse
from benchmarks.harness.commands import HNCE, Command, run_command, run_hnce, run_recipe
from benchmarks.harness.memory import (
    GIB,
    PeakMemory,
    own_peak_bytes,
    own_rss_bytes,
    reset_own_peak,
)
from benchmarks.harness.results import (
    RESULTS,
    ROOT,
    commit,
    plot,
    write_json,
    write_measures,
    write_result,
    write_text,
)
from benchmarks.harness.stages import StageState, last_modified, run_stages
from benchmarks.harness.timing import Timer, alternated_best, best_of, timed

__all__ = [
    "GIB",
    "HNCE",
    "RESULTS",
    "ROOT",
    "Command",
    "PeakMemory",
    "StageState",
    "Timer",
    "alternated_best",
    "arguments",
    "best_of",
    "commit",
    "invocation",
    "last_modified",
    "own_peak_bytes",
    "own_rss_bytes",
    "parse",
    "plot",
    "reset_own_peak",
    "run_command",
    "run_hnce",
    "run_recipe",
    "run_stages",
    "timed",
    "write_json",
    "write_measures",
    "write_result",
    "write_text",
]
