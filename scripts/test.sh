#!/usr/bin/env bash
# Set up if needed, then run the whole test suite (slow end-to-end tests included).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"` for the quick suite.
# Two pytest processes (pytest-xdist), each test module whole in one of them (its module
# fixtures run once): the end-to-end runs spend much of their time starting processes, so two
# at once use the 2 cores a CI machine has (on an idle 2-core machine, from a clean clone: 10.5
# and 11.9 min in two runs, 11.5 and 13.1 min with the install; before the 200,000-entity path, 8.6 min in two and 14.8
# in one). Starting the end-to-end modules first was slower (13.4 min): they contend for the CPUs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest --numprocesses 2 --dist loadfile "$@"
