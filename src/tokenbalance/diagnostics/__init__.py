"""Diagnostics: the papers' measurements and the logging sinks (docs/metrics.md): ``buckets``, ``grad_norms``,
``lld``, ``nthr_view``, ``step`` (the trainer's ``diag/*`` hooks), ``plots``, ``sinks``. Pure measurements (standard
library, numpy, torch, the algorithm core; never the trainer); :mod:`tokenbalance.analysis` runs them on a checkpoint.
"""
