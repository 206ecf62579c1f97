"""The DeepSpeed trainer under Ray Train, on asynchronously refreshed negatives (docs/refresh.md).

One driver (``trainer.run_task``; ``run_training`` for ``hnce train``), one worker loop
(``worker.WorkerRun``) and one contrastive step (``step``, over a ``batch.ContrastiveBatch``)
train both the retriever and the joint reranker (``task.TrainingTask``). The loop wires its
parts: ``negatives`` holds where negatives come from and the micro-batches a worker draws,
``checkpointing`` the DeepSpeed side of checkpoints (weights-only resume),
``trainer_cache`` a worker's negative cache; ``distributed`` holds the worker's device and
collectives, ``preemption`` the clean stop on SIGTERM (driver and workers). The worker's side of the refreshes (when it looks, waits and asks) is
``hnce.cluster.compute.refresh.handover``, with the rest of the refresh.
"""
