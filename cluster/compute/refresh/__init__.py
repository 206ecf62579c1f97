"""The refresh: re-encode the catalogue with a newer checkpoint, index it, mine negatives from
it, and hand them to the trainer (docs/refresh.md). Every part of it lives here; its record, the
refresh log, is a store (:mod:`hnce.cluster.stores.refresh_log`).

===================  ============================================================================
module               what it holds
===================  ============================================================================
``settings``         the ``refresh`` section of a recipe and the rules it sets on the rest
``plan``             :class:`~.plan.RefreshPlan`: what a run's refreshes do, where
``engine``           one refresh: encode, build, mine, publish (:func:`~.engine.run_refresh`)
``job``              a refresh under the run's lock, once or on a schedule (``hnce refresh``)
``coordinator``      the Ray actor that refreshes beside a trainer as checkpoints ask
``supervisor``       the trainer's start and stop of the coordinator
``heldout``          each refresh's held-out recall
``initial``          the initial negatives, trained on before the first refresh (version 0)
``handover``         a worker's side: when it looks, waits and asks
``health``           failures in a row stop training
``policy``           the interface of the policies: triggers (when) and modes (how)
``triggers/``        when a refresh is asked for: ``checkpoints``, ``stale``, ``payoff``
``modes/``           how the trainer meets them: ``async``, ``sync``
``timing``           a refresh's cost and the trainer's step time, as a worker measures them
``drawn``            how old the hard negatives a worker drew were
===================  ============================================================================
"""
