"""The run's named events: one home for the ``"event"`` strings its logs are written with.

A training run keeps two JSON-lines logs: the trainer's event log (``<run>/train_log.jsonl``,
``hnce.pipeline.event_log``) and the refresh log (``<run>/refresh_log.jsonl``,
``hnce.cluster.stores.refresh_log``). Every line names its kind in ``"event"``, and every kind
is a member of :class:`RunEvent`: writers and readers name it by the member, never by its string
(``tests/test_events.py`` checks the repository for literals). The values are the on-disk strings
and must not change, or logs of earlier runs stop being readable.

Each member's comment says when it is written and the fields its writer sets; every event-log
line also carries ``time`` (epoch seconds, added by ``EventLog.write``). ``REFRESH`` and
``HELDOUT_RECALL`` carry the fields of ``RefreshRecord`` and ``HeldoutRecall``
(``hnce.cluster.stores.refresh_log``). Who writes and who reads each member is derived from the
code, not kept here: ``.venv/bin/python tests/event_uses.py`` lists it, and
``tests/test_events.py`` checks that every member has a writer and a reader and that every field
a writer names is in its member's comment.
"""

from __future__ import annotations

from enum import StrEnum, unique


@unique
class RunEvent(StrEnum):
    """A named event of a run's logs; the value is the string on disk (see the module docs)."""

    #: the driver hands over to Ray Train: ``seconds`` (its start-up stages), ``cores``, ``gpus``
    #: and why (``cores_reason``, ``gpus_reason``)
    LAUNCH = "launch"
    #: rank 0 after its set-up: ``step`` (0), ``task``, ``world_size``, ``mentions``,
    #: ``skipped_missing_gold``, ``device``, ``bf16``, ``setup_seconds``
    START = "start"
    #: rank 0 resumed from a checkpoint: ``step``, ``path``, ``setup_seconds``
    RESUME = "resume"
    #: rank 0, every ``log_every`` steps and the last: ``step``, ``loss`` (null when not finite),
    #: ``lr``, ``seconds``, ``threads``, ``negatives_version``, ``lag``, ``hard_negatives``,
    #: ``fresh_hard_negatives``, ``fresh_share``, ``hard_negative_age`` (rank 0's since the last
    #: log), ``mentions`` (the step's mention ids)
    STEP = "step"
    #: rank 0 trained its last step: ``step``, ``loss``, ``negatives_version``
    END = "end"
    #: a published checkpoint: ``step``, ``path``, ``training_ends_at``
    CHECKPOINT = "checkpoint"
    #: rank 0 switched to a newer negatives version: ``step``, ``version``, ``checkpoint_step``,
    #: ``lag``
    NEGATIVES = "negatives"
    #: the loss columns a sampler keeps: ``sampler``, ``bytes``
    LOSS_COLUMNS = "loss_columns"
    #: a step waited for a refresh: ``step``, ``seconds``
    REFRESH_WAIT = "refresh_wait"
    #: how long the first step waited for the initial negatives: ``step``, ``seconds``
    INITIAL_NEGATIVES_WAIT = "initial_negatives_wait"
    #: a refresh's outcome, in the refresh log (a ``RefreshRecord``; a line without ``event`` is
    #: one too) and copied to the event log when published (``step``, ``checkpoint``,
    #: ``index_version``, ``negatives_version``, ``seconds``); ``hnce refresh`` prints one for
    #: the initial negatives (``outcome``, ``index_version``)
    REFRESH = "refresh"
    #: held-out recall of an index version, in the refresh log (a ``HeldoutRecall``) and copied to
    #: the event log (at scoring time; by the driver at a launch's end, those rank 0 missed)
    HELDOUT_RECALL = "heldout_recall"
    #: the driver when the initial negatives are ready: ``initial``, ``seconds``, ``encoded`` (the
    #: catalogue was encoded for them), ``error`` if they failed
    INITIAL_NEGATIVES = "initial_negatives"
    #: a non-finite loss, skipped: ``step``, ``cause``
    NONFINITE_LOSS = "nonfinite_loss"
    #: training stopped on non-finite values: ``step``, ``cause``
    NONFINITE_STOP = "nonfinite_stop"
    #: refreshes kept failing and training stopped: ``step``, ``cause``
    REFRESH_STOP = "refresh_stop"
    #: one failed refresh, copied: ``step``, ``checkpoint``, ``error``, ``consecutive``
    REFRESH_FAILED = "refresh_failed"
    #: no refresh would publish before training ends (the refresh's mode): ``step``,
    #: ``refresh_seconds``, ``seconds_left``
    REFRESHES_END = "refreshes_end"
    #: a refresh trigger's decision: ``trigger`` and its own fields (stale: ``step``,
    #: ``refresh``, ``version``, ``loss_ratio``; payoff: ``step``, ``refresh``, ``reason``,
    #: ``mean_age`` and the rest of its ``PayoffDecision``)
    REFRESH_DECISION = "refresh_decision"
    #: the negative cache was filled from an index version (``step``, ``version``,
    #: ``checkpoint_step``, ``replaced``, ``seconds``) or restored from a checkpoint
    #: (``restored``, ``path``)
    NEGATIVE_CACHE = "negative_cache"
