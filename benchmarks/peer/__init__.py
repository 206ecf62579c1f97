"""The parts of :mod:`benchmarks.peer_sentence_transformers`, one job each: recall curves
(:mod:`.curves`), the one evaluation path every model goes through (:mod:`.evaluation`), hnce's
runs (:mod:`.hnce_training`), the peer's run (:mod:`.peer_training`), the profile of one hnce
step (:mod:`.step_profile`) and the result file (:mod:`.report`)."""
