"""The run's named events: one home for the ``"event"`` strings its logs are written with.

A training run keeps two JSON-lines logs: the trainer's event log (``<run>/train_log.jsonl``,
``hnce.pipeline.event_log``) and the refresh log (``<run>/refresh_log.jsonl``,
``hnce.cluster.stores.refresh_log``). Every line names its kind in ``"event"``. The kinds that
more than one module writes or reads are the members of :class:`RunEvent`; their values are
the on-disk strings and must not change, or logs of earlier runs stop being readable.

=================  ====================  ==============================  ==================================
member             log                   written by                      read by
=================  ====================  ==============================  ==================================
REFRESH            refresh log           ``refresh_log.append_record``   ``refresh_log.read_log`` (a line
                   and event log         (a :class:`RefreshRecord`);     without ``event`` is one too);
                                         ``train.refresh_health`` (a     ``hnce watch`` (refresh seconds)
                                         published refresh, copied)
HELDOUT_RECALL     refresh log           ``refresh_log.append_heldout``  ``refresh_log.read_log``
                   and event log         (a :class:`HeldoutRecall`);
                                         ``train.refresh_health``
                                         (copied at scoring time)
INITIAL_NEGATIVES  event log             ``train.version_zero``: the     ``train.version_zero`` (the
                                         driver when negatives version   workers' wait), benchmarks
                                         0 is ready (``error`` if it
                                         failed)
NONFINITE_LOSS     event log             ``train.nonfinite``: a          tests
                                         non-finite loss, skipped
NONFINITE_STOP     event log             ``train.nonfinite``: training   ``train.nonfinite`` (the driver
                                         stopped on non-finite values    raises), ``hnce status``
STALE              event log             ``train.refresh_handover``:     ``hnce status`` (refresh
                                         the loss ratio asked for a      requests)
                                         refresh (``train.staleness``)
REFRESH_STOP       event log             ``train.refresh_health``:       ``train.refresh_health`` (the
                                         refreshes kept failing          driver raises), ``hnce status``
REFRESH_FAILED     event log             ``train.refresh_health``: one   tests
                                         failed refresh, copied
REFRESHES_END      event log             ``train.refresh_handover``:     tests
                                         refreshes stop paying off
                                         (``train.refresh_payoff``)
=================  ====================  ==============================  ==================================

The record fields of ``REFRESH`` and ``HELDOUT_RECALL`` are ``RefreshRecord`` and
``HeldoutRecall`` in ``hnce.cluster.stores.refresh_log``; the other events carry free keyword
fields (``step`` and ``cause`` for the stops), written where they happen.
"""

from __future__ import annotations

from enum import StrEnum


class RunEvent(StrEnum):
    """A named event of a run's logs; the value is the string on disk (see the module docs)."""

    REFRESH = "refresh"
    HELDOUT_RECALL = "heldout_recall"
    INITIAL_NEGATIVES = "initial_negatives"
    NONFINITE_LOSS = "nonfinite_loss"
    NONFINITE_STOP = "nonfinite_stop"
    STALE = "stale"
    REFRESH_STOP = "refresh_stop"
    REFRESH_FAILED = "refresh_failed"
    REFRESHES_END = "refreshes_end"
