#!/usr/bin/env bash
# One-shot, idempotent set-up on a fresh Debian machine with Python 3.11:
# Debian's WordNet files, a virtual environment in .venv, torch 2.13.0 (CPU) first and pinned by
# constraints.txt, then the project with its dev extras. Re-runs are a no-op unless
# pyproject.toml or constraints.txt changed.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -f /usr/share/wordnet/data.noun ]; then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq wordnet-base >/dev/null
fi

stamp=.venv/.setup-stamp
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

python3.11 -m venv .venv 2>/dev/null || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -c constraints.txt -e ".[dev]"
.venv/bin/python - <<'PY'
import torch
assert torch.__version__.startswith("2.13.0"), torch.__version__
assert torch.version.cuda is None, "a CUDA build of torch was pulled in"
PY
echo "$want" > "$stamp"
