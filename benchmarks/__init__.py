"""hnce's benchmarks: each module is one benchmark, run from the repository root as
``python -m benchmarks.<name>``; :mod:`benchmarks.harness` is what they share (arguments,
timing, peak memory, resumable stages, result files). Benchmarks are not tests: they print the
figures measured in one run and write them into ``benchmarks/results/``, which
``python -m benchmarks.report`` assembles into BENCHMARKS.md.
"""
