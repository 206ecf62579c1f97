"""The DeepSpeed trainer under Ray Train, on asynchronously refreshed negatives (DESIGN.md §5).

`run_training(config)` (pipeline/train/trainer.py) is the entry point: it starts the refresh
coordinator actor and a `TorchTrainer` whose workers run `train_loop_per_worker`
(pipeline/train/worker.py).
"""
