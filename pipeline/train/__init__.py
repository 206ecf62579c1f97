"""The DeepSpeed trainer under Ray Train, on asynchronously refreshed negatives (docs/refresh.md).

One driver (``trainer.run_task``; ``run_training`` for ``hnce train``), one worker loop
(``worker.WorkerRun``) and one contrastive step (``step``, over a ``batch.ContrastiveBatch``)
train both the retriever and the joint reranker (``task.TrainingTask``). ``negatives`` holds
where negatives come from, ``checkpointing`` the DeepSpeed side of checkpoints (weights-only
resume), ``distributed`` the worker's device and collectives.
"""
