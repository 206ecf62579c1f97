#!/usr/bin/env bash
# Set up if needed, then run the whole test suite (slow end-to-end tests included).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"` for the quick suite.
# Two pytest processes (pytest-xdist), each test module whole in one of them (its module
# fixtures run once): the end-to-end runs spend much of their time starting processes, so two
# at once use the 2 cores a CI machine has (the measured times are in the README). Starting the
# end-to-end modules first was slower: they contend for the CPUs. So were four processes (2026-11-29:
# 89% of the suite after 40 minutes, a load average of 17, one failure and three errors), and three
# (2026-12-06, from a clean clone: 16.4 minutes of tests against 14.6 with two; every test passed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest --numprocesses 2 --dist loadfile --durations 30 "$@"
