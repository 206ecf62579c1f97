#!/usr/bin/env bash
# Set up if needed, then run the main job end to end on the real WordNet default.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/hnce demo "$@"
