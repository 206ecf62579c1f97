"""Refuse an install that would put two FAISS builds side by side (docs/engines.md).

faiss-cpu and the FAISS GPU wheels (faiss-gpu-cu12, ...) all install the same `faiss` module, so
whichever is installed last silently wins. `scripts/setup.sh` resolves the whole install first
(`pip install --dry-run --ignore-installed --report REPORT ...`) and runs this on the report
before installing anything, then again on the environment once installed: each must hold
exactly the FAISS build of the chosen variant.

    python scripts/check_faiss_variant.py REPORT.json cpu|gpu     # a resolution
    python scripts/check_faiss_variant.py --installed cpu|gpu     # this environment
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

WANTED = {"cpu": "faiss-cpu", "gpu": "faiss-gpu"}


def canonical(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def faiss_builds(names: Iterable[str]) -> list[str]:
    """The FAISS distributions among `names` (faiss-cpu, faiss-gpu, faiss-gpu-cu12, ...)."""
    return sorted(name for name in map(canonical, names) if name.startswith("faiss-"))


def check(names: Iterable[str], variant: str) -> str:
    """The one FAISS build in `names`; ValueError if there are several or not the variant's."""
    builds = faiss_builds(names)
    if len(builds) != 1:
        raise ValueError(
            f"the {variant} install would hold {len(builds)} FAISS builds {builds}; exactly one "
            f"({WANTED[variant]}*) must own the `faiss` module"
        )
    if not builds[0].startswith(WANTED[variant]):
        raise ValueError(f"the {variant} install would use {builds[0]}, not {WANTED[variant]}*")
    return builds[0]


def installed_names(report: Mapping[str, Any]) -> list[str]:
    """Distribution names in a `pip install --report` document."""
    return [item["metadata"]["name"] for item in report.get("install", [])]


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] not in WANTED:
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] == "--installed":
        names = [dist.metadata["Name"] for dist in importlib.metadata.distributions()]
    else:
        names = installed_names(json.loads(Path(argv[0]).read_text(encoding="utf-8")))
    try:
        build = check(names, argv[1])
    except ValueError as error:
        print(f"check_faiss_variant: {error}", file=sys.stderr)
        return 1
    print(f"check_faiss_variant: {argv[1]} install uses {build} only")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
