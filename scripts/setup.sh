#!/usr/bin/env bash
# One-shot, idempotent set-up on a fresh Debian machine with Python 3.11:
# Debian's WordNet files, a virtual environment in .venv, torch 2.13.0 first and pinned by
# constraints.txt, then the project with its dev extras and exactly one FAISS build:
#   scripts/setup.sh          CPU: the `cpu` extra (faiss-cpu) and the local CPU torch wheel
#   scripts/setup.sh --gpu    GPU nodes: the `gpu` extra (faiss-gpu-cu12) and a CUDA torch build
# Both FAISS wheels own the `faiss` module, so the install is resolved first (a pip dry run) and
# refused when it would hold both (scripts/check_faiss_variant.py), then checked again installed.
# Re-runs are a no-op unless pyproject.toml, constraints.txt or the variant changed.
set -euo pipefail
cd "$(dirname "$0")/.."

variant=cpu
case "${1:-}" in
  "") ;;
  --gpu) variant=gpu ;;
  *) echo "usage: scripts/setup.sh [--gpu]" >&2; exit 2 ;;
esac

if [ ! -f /usr/share/wordnet/data.noun ]; then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq wordnet-base >/dev/null
fi

stamp=.venv/.setup-stamp
want=$( (cat pyproject.toml constraints.txt; echo "$variant") | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

python3.11 -m venv .venv 2>/dev/null || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
report=$(mktemp)
trap 'rm -f "$report"' EXIT
.venv/bin/python -m pip install -q --dry-run --ignore-installed --report "$report" \
  -c constraints.txt -e ".[$variant,dev]"
.venv/bin/python scripts/check_faiss_variant.py "$report" "$variant"
other=faiss-gpu-cu12
[ "$variant" = gpu ] && other=faiss-cpu
.venv/bin/python -m pip uninstall -q -y "$other" 2>/dev/null || true
.venv/bin/python -m pip install -q -c constraints.txt -e ".[$variant,dev]"
.venv/bin/python scripts/check_faiss_variant.py --installed "$variant"
HNCE_VARIANT=$variant .venv/bin/python - <<'PY'
import os

import faiss
import torch

assert torch.__version__.startswith("2.13.0"), torch.__version__
if os.environ["HNCE_VARIANT"] == "cpu":
    assert torch.version.cuda is None, "a CUDA build of torch was pulled in"
else:
    assert torch.version.cuda is not None, "GPU nodes need a CUDA build of torch"
    assert hasattr(faiss, "StandardGpuResources"), "the faiss module is not the GPU build"
PY
echo "$want" > "$stamp"
