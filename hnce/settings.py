"""The building blocks of hnce's one settings tree (``hnce.pipeline.config.Config``).

Each package declares the settings it consumes where it consumes them (the scorer in
``hnce.encoders.scorers``, the index in ``hnce.cluster.stores.index_spec``, the refresh in ``hnce.cluster.compute.refresh.settings``,
the cluster in ``hnce.cluster.compute.session``) with the :func:`settings` decorator below, and
``hnce.pipeline.config`` composes them into one tree loaded from YAML. A section is a pydantic
dataclass: constructing it validates every field (types are strict: no ``"8"`` for 8, no
``true`` for 1), unknown keys are errors, and ranges are declared on the field, so a bad value is
reported with its dotted key (and, from a recipe, its file and line). Real-valued settings are
finite: ``.inf`` and ``.nan`` are refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Annotated, Any

from pydantic import BeforeValidator, ConfigDict, Field, StrictBool, StrictInt, StrictStr
from pydantic.dataclasses import dataclass


def _reject_bool(value: object) -> object:
    if isinstance(value, bool):
        raise ValueError("expected a number, got a boolean")
    return value


def settings(cls: type) -> type:
    """Make ``cls`` a settings section: a validating dataclass that refuses unknown keys. Its
    docstring stays (pydantic's copy of a class built by ``make_dataclass`` drops it): the
    ``Attributes:`` block there describes its keys (``hnce.pipeline.config.reference``)."""
    section = dataclass(config=ConfigDict(extra="forbid", validate_assignment=True))(cls)
    section.__doc__ = cls.__doc__
    return section


def section_with_groups(
    name: str, doc: str, module: str, fields: list[tuple[str, Any, Any]], specs: Iterable[Any]
) -> type:
    """A settings section ``name`` (its docstring ``doc``, declared in ``module``) of ``fields``
    ((key, type, default or ``dataclasses.field``)), then one option group per member of a
    registry that has options (``spec.group``: a default ``spec.options``): the negatives'
    samplers, the refresh's triggers. A new member with options is a new group, nothing else."""
    groups = [
        (spec.group, spec.options, dataclasses.field(default_factory=spec.options))
        for spec in specs
        if spec.options is not None
    ]
    section = dataclasses.make_dataclass(
        name, [*fields, *groups], namespace={"__doc__": doc, "__module__": module}
    )
    return settings(section)


PositiveInt = Annotated[StrictInt, Field(gt=0)]
NonNegativeInt = Annotated[StrictInt, Field(ge=0)]
# Every real setting is finite: a YAML ``.inf`` or ``.nan`` is refused at load, where it is named.
Real = Annotated[float, BeforeValidator(_reject_bool), Field(allow_inf_nan=False)]
PositiveReal = Annotated[float, BeforeValidator(_reject_bool), Field(gt=0, allow_inf_nan=False)]
NonNegativeReal = Annotated[float, BeforeValidator(_reject_bool), Field(ge=0, allow_inf_nan=False)]
Fraction = Annotated[float, BeforeValidator(_reject_bool), Field(ge=0, le=1, allow_inf_nan=False)]
Flag = StrictBool
Text = StrictStr

__all__ = [
    "Flag",
    "Fraction",
    "NonNegativeInt",
    "NonNegativeReal",
    "PositiveInt",
    "PositiveReal",
    "Real",
    "Text",
    "section_with_groups",
    "settings",
]
