"""The parts of :mod:`benchmarks.full_scale`, one job each: the run's work directory, recipe,
model and state (:mod:`.run`), its stages, each one real ``hnce`` command (:mod:`.stages`), and
the result file written from the state (:mod:`.report`)."""
