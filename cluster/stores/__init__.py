"""On-disk stores (docs/stores.md): what a dataset and a run hold, and the one way each is
written (a staging sibling published by rename, :mod:`hnce.cluster.stores.files`) and verified on
reading (manifests with SHA-256, confined paths, versions). Nothing here imports Ray, so a store
can be read on any machine that mounts it (``hnce status``, ``hnce data verify``).
"""
