"""The cluster layer: on-disk stores and the Ray compute that fills and searches them
(docs/architecture.md).

- :mod:`hnce.cluster.stores`: the run's and the dataset's on-disk state (dataset tables, token
  store, index and negatives versions, checkpoints, refresh log, the lock holder's record), each
  written by one atomic protocol and verified on reading; no Ray.
- :mod:`hnce.cluster.compute`: Ray actors and jobs (session, encoder pool, shard holders, index
  building, miner, the refresh, its coordinator and stand-alone job, the run lock, retrieval for
  evaluation), which read and write the stores.

Imports flow ``compute → stores``; both may import :mod:`hnce.mining` and :mod:`hnce.encoders`.
"""
