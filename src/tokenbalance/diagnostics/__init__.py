"""Diagnostics: the papers' measurements and the logging sinks (docs/metrics.md).

``buckets`` (token statistics by probability bucket), ``grad_norms`` (gradient norm per bucket), ``lld`` (lazy
likelihood displacement), ``nthr_view`` (NTHR's selected tokens), ``step`` (the trainer's per-step hooks, ``diag/*``),
``plots`` (``tokenbalance plot``), ``sinks`` (JSONL, TensorBoard, W&B). Pure measurements: the standard library,
numpy, torch and the algorithm core, never the trainer; :mod:`tokenbalance.analysis` runs them on a checkpoint."""
