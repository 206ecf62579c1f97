"""The run's named events: one home for the ``"event"`` strings its logs are written with.

A training run keeps two JSON-lines logs: the trainer's event log (``<run>/train_log.jsonl``,
``hnce.pipeline.event_log``) and the refresh log (``<run>/refresh_log.jsonl``,
``hnce.cluster.stores.refresh_log``). Every line names its kind in ``"event"``, and every kind
is a member of :class:`RunEvent`: writers and readers name it by the member, never by its string
(``tests/test_events.py`` checks the package for literals). The values are the on-disk strings
and must not change, or logs of earlier runs stop being readable.

======================  ===========  ===============================  ==============================
member                  log          written by                       read by
======================  ===========  ===============================  ==============================
LAUNCH                  event log    ``train.trainer``: the driver,   ``train.refresh_supervisor``
                                     handing over to Ray Train        (``gpus``: the GPU mode a
                                     (``seconds``: its start-up       standalone refresh shares),
                                     stages; ``cores``, ``gpus`` and  benchmarks (``seconds``,
                                     their ``*_reason``)              ``cores``)
START                   event log    ``train.worker``: rank 0 after   ``train.trainer`` summary
                                     its set-up (``task``,            (``task``, ``mentions``,
                                     ``world_size``, ``mentions``,    ``skipped_missing_gold``),
                                     ``skipped_missing_gold``,        ``hnce status`` (lifecycle),
                                     ``device``, ``bf16``,            benchmarks (``time``), tests
                                     ``setup_seconds``)               (``world_size``)
RESUME                  event log    ``train.checkpointing``: rank 0  ``train.trainer`` summary
                                     resumed from a checkpoint        (``step``), ``hnce status``
                                     (``step``, ``path``,             (lifecycle), tests
                                     ``setup_seconds``)
STEP                    event log    ``train.worker``: rank 0, every  ``hnce status`` and its plot
                                     ``log_every`` steps and the      (``step``, ``loss``, ``lag``,
                                     last (``step``, ``loss``: null   ``time``), TensorBoard
                                     when not finite, ``lr``,         (``tensorboard.SCALARS``:
                                     ``seconds``, ``threads``,        ``loss``, ``lr``, ``seconds``,
                                     ``negatives_version``, ``lag``,  ``lag``,
                                     ``hard_negatives``,              ``negatives_version``,
                                     ``fresh_hard_negatives``,        ``fresh_share``,
                                     ``fresh_share``,                 ``hard_negative_age``), the
                                     ``hard_negative_age``: rank 0's  progress bar (``step``,
                                     since the last log;              ``loss``,
                                     ``mentions``: the
                                     step's mention ids)              ``negatives_version``),
                                                                      benchmarks (``time``,
                                                                      ``seconds``, ``mentions``,
                                                                      ``threads``)
END                     event log    ``train.worker``: rank 0         ``train.trainer`` summary
                                     trained its last step            (``step``, ``loss``),
                                     (``step``, ``loss``,             ``hnce status`` (lifecycle),
                                     ``negatives_version``)           the progress bar, benchmarks
                                                                      (``time``)
CHECKPOINT              event log    ``train.checkpointing``: a       ``train.trainer`` summary
                                     published checkpoint (``step``,  (``step``), ``demo`` training
                                     ``path``, ``training_ends_at``)  curves (``step``, ``time``),
                                                                      benchmarks (``step``,
                                                                      ``time``)
NEGATIVES               event log    ``train.negatives``: rank 0      ``train.trainer`` summary (the
                                     switched to a newer negatives    events whole), benchmarks
                                     version (``step``, ``version``,  (``version``), tests
                                     ``checkpoint_step``, ``lag``)
LOSS_COLUMNS            event log    ``train.negatives``: the loss    tests
                                     columns a sampler keeps
                                     (``sampler``, ``bytes``)
REFRESH_WAIT            event log    ``train.refresh_handover``: a    TensorBoard (``seconds``),
                                     step waited for a refresh        benchmarks (``seconds``)
                                     (``step``, ``seconds``)
INITIAL_NEGATIVES_WAIT  event log    ``train.refresh_handover``: how  benchmarks (``seconds``),
                                     long the first step waited for   tests
                                     version 0 (``step``,
                                     ``seconds``)
REFRESH                 refresh log  ``refresh_log.append_record``    ``refresh_log.read_log`` (a
                        and event    (a :class:`RefreshRecord`);      line without ``event`` is one
                        log          ``train.refresh_health`` (a      too; through it
                                     published refresh, copied:       ``hnce status`` and the
                                     ``step``, ``checkpoint``,        progress bar); TensorBoard
                                     ``index_version``,               (``seconds``)
                                     ``negatives_version``,
                                     ``seconds``); ``hnce refresh``
                                     prints one for version 0
HELDOUT_RECALL          refresh log  ``refresh_log.append_heldout``   ``refresh_log.read_log``
                        and event    (a :class:`HeldoutRecall`);      (through it the plot of
                        log          ``train.refresh_health``         ``hnce status`` and the
                                     (copied at scoring time; by the  progress bar); TensorBoard
                                     driver at a launch's end, those  (``recall``);
                                     rank 0 missed)                   ``refresh_health`` (``step``,
                                                                      ``index_version``, ``time``:
                                                                      what it copied)
INITIAL_NEGATIVES       event log    ``train.version_zero``: the      ``train.version_zero`` (the
                                     driver when negatives version 0  workers' wait: ``time``,
                                     is ready (``initial``,           ``error``), benchmarks,
                                     ``seconds``, ``encoded``: the    ``train.refresh_payoff``
                                     catalogue was encoded for it;    (``seconds``, ``encoded``)
                                     ``error`` if it failed)
NONFINITE_LOSS          event log    ``train.nonfinite``: a           tests
                                     non-finite loss, skipped
                                     (``step``, ``cause``)
NONFINITE_STOP          event log    ``train.nonfinite``: training    ``train.nonfinite`` (the
                                     stopped on non-finite values     driver raises),
                                     (``step``, ``cause``)            ``hnce status`` (``cause``)
STALE                   event log    ``train.refresh_handover``: the  ``hnce status`` (refresh
                                     loss ratio asked for a refresh   requests: ``step``,
                                     (``train.staleness``; ``step``,  ``version``, ``loss_ratio``),
                                     ``version``, ``loss_ratio``)     TensorBoard (``loss_ratio``)
REFRESH_STOP            event log    ``train.refresh_health``:        ``train.refresh_health`` (the
                                     refreshes kept failing           driver raises),
                                     (``step``, ``cause``)            ``hnce status`` (``cause``)
REFRESH_FAILED          event log    ``train.refresh_health``: one    tests
                                     failed refresh, copied
REFRESHES_END           event log    ``train.refresh_handover``:      tests
                                     refreshes stop paying off
                                     (``train.refresh_payoff``;
                                     ``step``, ``refresh_seconds``,
                                     ``seconds_left``)
REFRESH_DECISION        event log    ``train.refresh_handover``:      ``hnce status`` (refresh
                                     whether a checkpoint asks for a  requests: ``step``,
                                     refresh (``refresh.trigger:      ``refresh``, ``reason``,
                                     payoff``; ``step``, ``refresh``, ``mean_age``), TensorBoard
                                     ``reason``, ``mean_age``,        (``mean_age``), tests
                                     ``hard_negatives``,
                                     ``max_age``,
                                     ``refresh_seconds``,
                                     ``cost_source``,
                                     ``step_seconds``,
                                     ``latency_steps``,
                                     ``steps_left``:
                                     ``train.refresh_payoff``)
NEGATIVE_CACHE          event log    ``train.negative_cache``: the    benchmarks (``seconds``,
                                     negative cache was filled from   ``replaced``), tests
                                     an index version (``step``,
                                     ``version``, ``checkpoint_step``,
                                     ``replaced``, ``seconds``) or
                                     restored from a checkpoint
                                     (``restored``)
======================  ===========  ===============================  ==============================

Every event-log line also carries ``time`` (epoch seconds, added by ``EventLog.write``). The
fields in brackets are those the writer sets; where a reader is followed by fields, those are the
ones it relies on (a writer that drops or renames one breaks it). The record fields of
``REFRESH`` and ``HELDOUT_RECALL`` are ``RefreshRecord`` and ``HeldoutRecall`` in
``hnce.cluster.stores.refresh_log``; the other events carry free keyword fields, written where
they happen.
"""

from __future__ import annotations

from enum import StrEnum, unique


@unique
class RunEvent(StrEnum):
    """A named event of a run's logs; the value is the string on disk (see the module docs)."""

    LAUNCH = "launch"
    START = "start"
    RESUME = "resume"
    STEP = "step"
    END = "end"
    CHECKPOINT = "checkpoint"
    NEGATIVES = "negatives"
    LOSS_COLUMNS = "loss_columns"
    REFRESH_WAIT = "refresh_wait"
    INITIAL_NEGATIVES_WAIT = "initial_negatives_wait"
    REFRESH = "refresh"
    HELDOUT_RECALL = "heldout_recall"
    INITIAL_NEGATIVES = "initial_negatives"
    NONFINITE_LOSS = "nonfinite_loss"
    NONFINITE_STOP = "nonfinite_stop"
    STALE = "stale"
    REFRESH_STOP = "refresh_stop"
    REFRESH_FAILED = "refresh_failed"
    REFRESHES_END = "refreshes_end"
    REFRESH_DECISION = "refresh_decision"
    NEGATIVE_CACHE = "negative_cache"
