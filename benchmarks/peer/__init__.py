"""The parts of :mod:`benchmarks.peer_sentence_transformers`, one job each: recall curves
(:mod:`.curves`), the one evaluation path every model goes through (:mod:`.evaluation`), hnce's
run (:mod:`.hnce_training`), the peer's run (:mod:`.peer_training`) and the result file
(:mod:`.report`). The two training steps side by side: :mod:`benchmarks.step_parity`."""
