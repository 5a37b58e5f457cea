"""Full-graph distributed training in parts: the run's configuration (:mod:`.config`), what a rank holds
(:mod:`.graph`), the assembly of operator, model, policy work and optimiser (:mod:`.assembly`), the epoch loop
(:mod:`.trainer`), the audit (:mod:`.audit`), metrics and byte counters (:mod:`.metrics`) and checkpoint state
(:mod:`.state`). :mod:`algorithms.train` is the public face (``Trainer``, ``TrainConfig``, ``LocalGraph``).
"""
