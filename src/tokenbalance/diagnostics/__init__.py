"""Diagnostics: the papers' measurements and the logging sinks.

* ``buckets``: token statistics by probability bucket (AR-Lopti Figure 1 a-b, Figure 3);
* ``grad_norms``: policy-gradient norm restricted to each bucket (Figure 1 d);
* ``lld``: lazy likelihood displacement of correct responses (NTHR paper §4);
* ``nthr_view``: which negative tokens NTHR selects, for inspection;
* ``step``: the per-step hooks the trainer calls (``diagnostics`` config section, ``diag/*`` keys);
* ``plots``: figures from ``metrics.jsonl`` (``tokenbalance plot``);
* ``sinks``: JSONL always, TensorBoard / W&B on request.

Pure measurements: they import only the standard library, numpy, torch and the algorithm core
(never the trainer); :mod:`tokenbalance.analysis` builds probe batches and runs them on a checkpoint.
"""
