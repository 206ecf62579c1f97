"""The refresh triggers' registry (hnce.cluster.compute.refresh.triggers): a trigger is one module
with a ``SPEC``, and the ``refresh`` section, its validation, TensorBoard and ``hnce status`` take
it from there; nothing else is edited to add one."""

from __future__ import annotations

from pathlib import Path

import pytest
from training_helpers import CONFIGS, REFRESHED

from hnce.cluster.compute.refresh import settings as refresh_settings
from hnce.cluster.compute.refresh import triggers
from hnce.cluster.compute.refresh.policy import TriggerSpec
from hnce.cluster.compute.refresh.settings import refresh_problem
from hnce.cluster.compute.refresh.triggers import TRIGGER_SPECS
from hnce.events import RunEvent
from hnce.mining.registry import collect_specs
from hnce.pipeline.config import ConfigError, load_config
from hnce.pipeline.tensorboard import SCALARS

EVERY_TENTH = """
from hnce.cluster.compute.refresh.policy import NO_REFRESH, Decision, TriggerSpec
from hnce.settings import PositiveInt, settings


@settings
class EveryOptions:
    every: PositiveInt = 10


class EveryNth:
    def __init__(self, every: int) -> None:
        self.every = every

    def after_step(self, step, loss, version):
        pass

    def look(self, step):
        return Decision(step % self.every == 0, {"step": step}) if step else NO_REFRESH

    def at_checkpoint(self, step):
        return NO_REFRESH

    def asked(self, step):
        pass


SPEC = TriggerSpec(
    name="every-nth",
    build=lambda context: EveryNth(context.options.every),
    options=EveryOptions,
    summary=lambda decisions: f"every-nth: {len(decisions)} asked",
)
"""


def test_every_trigger_declares_itself_and_its_option_group() -> None:
    assert set(TRIGGER_SPECS) == {"checkpoints", "stale", "payoff"}
    config = load_config(
        CONFIGS / "synthetic-test.yaml",
        [*REFRESHED, "refresh.stale.window=3", "refresh.payoff.max_negative_age=7"],
    )
    assert (config.refresh.stale.window, config.refresh.payoff.max_negative_age) == (3, 7)
    for spec in TRIGGER_SPECS.values():
        assert spec.summary is not None and spec.summary([])  # a line even before a decision
        for field, tag in spec.scalars.items():
            assert SCALARS[(RunEvent.REFRESH_DECISION, field)] == tag
    with pytest.raises(ConfigError, match=r"refresh\.payoff\.max_negative_age"):
        load_config(None, ["refresh.payoff.max_negative_age=0"])


def test_a_new_trigger_is_one_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module dropped into the package is collected, and the ``refresh`` section built from the
    specs gains its name and its typed option group; an asynchronous trigger under ``sync`` is
    refused by the same rule as the others."""
    (tmp_path / "every_nth.py").write_text(EVERY_TENTH)
    monkeypatch.setattr(triggers, "__path__", [*triggers.__path__, str(tmp_path)])
    specs = collect_specs(triggers.__name__, triggers.__path__, TriggerSpec, "trigger")
    assert set(specs) == {"checkpoints", "every-nth", "payoff", "stale"}
    monkeypatch.setattr(refresh_settings, "TRIGGER_SPECS", specs)
    section = refresh_settings._refresh_section()
    refresh = section(trigger="every-nth", every_nth=specs["every-nth"].options(every=4))
    assert refresh.every_nth.every == 4 and section().every_nth.every == 10
    with pytest.raises(ValueError, match="every"):
        specs["every-nth"].options(every=0)
    refresh.mode = "sync"
    problem = refresh_problem(refresh, True, "train", 1, trigger_set=True)
    assert problem is not None and problem[0] == "refresh.trigger"
    assert specs["every-nth"].summary is not None
    assert specs["every-nth"].summary([{"step": 10}]) == "every-nth: 1 asked"


def test_a_trigger_module_without_a_spec_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "forgotten.py").write_text("class Forgotten:\n    pass\n")
    monkeypatch.setattr(triggers, "__path__", [*triggers.__path__, str(tmp_path)])
    with pytest.raises(TypeError, match="must end with SPEC = TriggerSpec"):
        collect_specs(triggers.__name__, triggers.__path__, TriggerSpec, "trigger")
