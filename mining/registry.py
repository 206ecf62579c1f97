"""Registries by name: build a sampler or a loss by name, with errors that name what is known,
and collect the ``SPEC`` every module of a package declares (the samplers, the refresh's
triggers)."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

Built = TypeVar("Built")
Spec = TypeVar("Spec")


def collect_specs(
    package: str,
    path: Iterable[str],
    spec_type: type[Spec],
    kind: str,
    skip: frozenset[str] = frozenset(),
) -> dict[str, Spec]:
    """The ``SPEC`` of every module of ``package`` (found on ``path``, its ``__path__``) but
    ``skip``, by its ``name``, sorted: a new member of the registry is a new module. TypeError for
    a module without a ``spec_type`` ``SPEC`` and for a name declared twice (``kind`` names the
    members in the messages: "sampler", "trigger")."""
    specs: dict[str, Spec] = {}
    for module_info in pkgutil.iter_modules(list(path)):
        if module_info.name in skip:
            continue
        module = importlib.import_module(f"{package}.{module_info.name}")
        spec = getattr(module, "SPEC", None)
        if not isinstance(spec, spec_type):
            raise TypeError(
                f"{module.__file__}: a {kind} module must end with SPEC = {spec_type.__name__}(...)"
            )
        name = spec.name  # type: ignore[attr-defined]
        if name in specs:
            raise TypeError(f"{module.__file__}: {kind} {name!r} is declared twice")
        specs[name] = spec
    return dict(sorted(specs.items()))


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
