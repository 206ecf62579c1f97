"""The building blocks of hnce's one settings tree (``hnce.pipeline.config.Config``).

Each package declares the settings it consumes where it consumes them (the scorer in
``hnce.encoders.scorers``, the index in ``hnce.cluster.stores.sharded_index``, the refresh in ``hnce.cluster.compute.refresh``,
the cluster in ``hnce.cluster.compute.session``) with the :func:`settings` decorator below, and
``hnce.pipeline.config`` composes them into one tree loaded from YAML. A section is a pydantic
dataclass: constructing it validates every field (types are strict: no ``"8"`` for 8, no
``true`` for 1), unknown keys are errors, and ranges are declared on the field, so a bad value is
reported with its dotted key (and, from a recipe, its file and line). Real-valued settings are
finite: ``.inf`` and ``.nan`` are refused.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, ConfigDict, Field, StrictBool, StrictInt, StrictStr
from pydantic.dataclasses import dataclass


def _reject_bool(value: object) -> object:
    if isinstance(value, bool):
        raise ValueError("expected a number, got a boolean")
    return value


def settings(cls: type) -> type:
    """Make ``cls`` a settings section: a validating dataclass that refuses unknown keys."""
    return dataclass(config=ConfigDict(extra="forbid", validate_assignment=True))(cls)


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
    "settings",
]
