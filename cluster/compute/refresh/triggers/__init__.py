"""When a refresh is asked for (``refresh.trigger``), one module each, declared once.

Every module here ends with a ``SPEC`` (:class:`~hnce.cluster.compute.refresh.policy.TriggerSpec`);
:data:`TRIGGER_SPECS` collects them by name when the package is imported, and the ``refresh``
settings section (one option group per trigger with options), its validation, the hand-over,
TensorBoard and ``hnce status`` read them. A new trigger is a new module and its test.

- ``checkpoints``: every checkpoint asks (:mod:`.checkpoints`);
- ``stale``: a checkpoint asks once the loss on the negatives in use has fallen (:mod:`.stale`);
- ``payoff`` (the default): a checkpoint asks once the hard negatives drawn have aged and a
  refresh would publish with enough steps left to train on it (:mod:`.payoff`).
"""

from __future__ import annotations

from hnce.cluster.compute.refresh.policy import TriggerSpec
from hnce.mining.registry import collect_specs

TRIGGER_SPECS: dict[str, TriggerSpec] = collect_specs(__name__, __path__, TriggerSpec, "trigger")
