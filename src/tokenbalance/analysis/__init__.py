"""Above the trainer: probe batches built with the trainer's own pieces (:mod:`.probe`) and the papers' offline
experiments on them (:mod:`.experiments`: Figure 1 and 3 by bucket, LLD, the NTHR view), which ``tokenbalance
diagnose`` and the grid's Figure 1 run (docs/metrics.md)."""
