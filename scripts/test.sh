#!/usr/bin/env bash
# Set up if needed, then run the whole test suite (slow end-to-end tests included).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"` for the quick suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
