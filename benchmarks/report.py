"""Rebuild BENCHMARKS.md from the per-benchmark result files in ``benchmarks/results/``.

Every benchmark writes its own ``benchmarks/results/<name>.md`` and rebuilds BENCHMARKS.md
(:mod:`benchmarks.harness.results`), so BENCHMARKS.md always holds the latest figures of every
benchmark. Run on its own after editing a result file by hand:

    .venv/bin/python -m benchmarks.report
"""

from __future__ import annotations

from benchmarks import harness


def main() -> None:
    harness.parse(harness.arguments(__doc__, None))
    print(f"wrote {harness.update_benchmarks_md()}")


if __name__ == "__main__":
    main()
