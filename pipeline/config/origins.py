"""Where each key of a recipe was set (``file:line`` or ``--set ...``), and the error naming it.

The loader records an origin per dotted key; every :class:`ConfigError` about a key starts with
the origin :func:`origin_of` finds for it, so a message points at the line to edit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hnce.errors import InputError


class ConfigError(InputError):
    """A malformed configuration; the message names the offending key (and file:line)."""


def origin_of(key: str, origins: Mapping[str, str]) -> str:
    """The origin of ``key``, else of a key inside it (``loss`` → ``loss.name``), else of its
    nearest parent section, else of the recipe."""
    if key in origins:
        return origins[key]
    inside = [origin for name, origin in origins.items() if name.startswith(key + ".")]
    if inside:
        return inside[0]
    parts = key.split(".")
    for end in range(len(parts) - 1, 0, -1):
        found = origins.get(".".join(parts[:end]))
        if found:
            return found
    return origins.get("") or "config"


def dotted(location: Sequence[int | str]) -> str:
    """A pydantic error location as a dotted key (``eval.ks[2]``)."""
    key = ""
    for part in location:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
    return key
