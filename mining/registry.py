"""Build a sampler or a loss by name from its registry, with errors that name what is known."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

Built = TypeVar("Built")


def build_by_name(
    kind: str, registry: Mapping[str, Callable[..., Built]], name: str, options: dict[str, Any]
) -> Built:
    """``registry[name](**options)``; ValueError for an unknown name or options the constructor
    does not take (``kind`` is "sampler" or "loss", for the message)."""
    factory = registry.get(name)
    if factory is None:
        known = ", ".join(sorted(registry))
        raise ValueError(f"unknown {kind} {name!r} (known: {known})")
    try:
        return factory(**options)
    except TypeError as error:
        raise ValueError(f"bad options for {kind} {name!r}: {error}") from error
