"""The ``diagnostics`` config section: which measurements a training run makes (docs/metrics.md, ``diag/*``)."""

from __future__ import annotations

from dataclasses import dataclass

from tokenbalance.options import option


@dataclass
class DiagnosticsConfig:
    bucket_edges: tuple[float, ...] = option(
        (0.0, 0.25, 0.5, 0.75, 1.0),
        "probability bucket edges (must start at 0 and end at 1)",
        default_factory=lambda: (0.0, 0.25, 0.5, 0.75, 1.0),
    )
    bucket_mode: str = option(
        "fixed",
        "fixed: the edges above; quantile: equal-count buckets from the step's "
        "token-probability quantiles (len(bucket_edges) - 1 of them)",
        choices=("fixed", "quantile"),
    )
    bucket_stats: bool = option(True, "log token statistics per probability bucket every step (free)")
    grad_share: bool = option(
        True,
        "with bucket_stats: log each probability bucket's share of the squared logit-gradient norm every "
        "step, before and after the method's token stage (one more reduction over the vocabulary in the "
        "update's forward)",
    )
    grad_norm_every: int = option(
        0, "per-bucket policy-gradient norms every k steps (0 = off; one extra backward per bucket)", low=0, high=10**7
    )
    grad_norm_rows: int = option(
        16,
        "responses in the gradient-norm probe (a seeded sample of the step's batch; 0 = the whole batch)",
        low=0,
        high=10**7,
    )
    grad_norm_per_layer: bool = option(
        True, "also log the gradient norm of each decoder layer, the embedding, the head and the rest"
    )
    lld: bool = option(
        False, "LLD monitor: re-score correct responses of mixed groups after the update (one extra no-grad forward)"
    )
    lld_epsilon: float = option(
        0.0, "a group counts as LLD when its likelihood change is below this", low=-1e6, high=1e6
    )

    @property
    def logs_grad_share(self) -> bool:
        """Whether the update records the per-token logit-gradient norms for ``diag/bucket<b>/grad_share*``."""
        return self.bucket_stats and self.grad_share

    def __post_init__(self) -> None:
        from tokenbalance.diagnostics.edges import check_bucket_edges

        self.bucket_edges = check_bucket_edges(self.bucket_edges)
