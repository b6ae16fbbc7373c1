"""Confidence intervals over seeds: Student's t quantile (the t CDF inverted by bisection; standard library only),
mean
+- CI, paired differences. The formulas: docs/ablate.md ("How the confidence intervals are computed")."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

_TINY = 1e-300


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b) (Numerical Recipes ``betacf``, modified Lentz)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, 1000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _TINY else _TINY
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _TINY else _TINY
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def regularized_incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    if not (a > 0 and b > 0):
        raise ValueError(f"incomplete beta: a and b must be > 0, got a={a}, b={b}")
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"incomplete beta: x must be in [0, 1], got {x}")
    if x in (0.0, 1.0):
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"t distribution: degrees of freedom must be > 0, got {df}")
    tail = 0.5 * regularized_incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (e.g. p=0.975, df=2: 4.3027)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t quantile: p must be in (0, 1), got {p}")
    if df <= 0:
        raise ValueError(f"t distribution: degrees of freedom must be > 0, got {df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if p == 0.5:
        return 0.0
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:  # bracket: the quantile lies in [low, high]
        low, high = high, high * 2.0
    for _ in range(200):
        mid = 0.5 * (low + high)
        if t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
        if high - low <= 1e-13 * max(1.0, high):
            break
    return 0.5 * (low + high)


@dataclass(frozen=True)
class Estimate:
    """Mean of ``n`` values with its two-sided ``level`` confidence interval (t over the values).

    ``half_width`` (and so ``low`` / ``high``) is NaN when n < 2: one seed gives no interval."""

    n: int
    mean: float
    sd: float
    half_width: float
    level: float = 0.95

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    @property
    def excludes_zero(self) -> bool:
        return self.n >= 2 and (self.low > 0 or self.high < 0)


def mean_ci(values: Sequence[float], level: float = 0.95) -> Estimate:
    """Mean, sample standard deviation and t confidence interval of ``values`` (one per seed)."""
    n = len(values)
    if n == 0:
        return Estimate(0, math.nan, math.nan, math.nan, level)
    mean = math.fsum(values) / n
    if n == 1:
        return Estimate(1, mean, math.nan, math.nan, level)
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile(0.5 + level / 2.0, n - 1) * sd / math.sqrt(n)
    return Estimate(n, mean, sd, half, level)


def common_seeds(a: Mapping[int, float], b: Mapping[int, float]) -> list[int]:
    return sorted(set(a) & set(b))


def paired_difference(method: Mapping[int, float], baseline: Mapping[int, float], level: float = 0.95) -> Estimate:
    """The mean over common seeds of ``method[s] - baseline[s]`` with its t interval (paired by seed)."""
    seeds = common_seeds(method, baseline)
    return mean_ci([method[s] - baseline[s] for s in seeds], level)


def detectable_difference(difference: Estimate, power: float = 0.8) -> float:
    """The smallest true paired difference that a two-sided test at ``1 - difference.level`` over ``difference.n``
    seeds detects with probability ``power``, given its observed spread ``sd``: ``(t_{(1+level)/2, n-1} + t_{power,
    n-1}) * sd / sqrt(n)``. NaN with fewer than 2 seeds."""
    if difference.n < 2:
        return math.nan
    df = difference.n - 1
    quantiles = t_quantile(0.5 + difference.level / 2.0, df) + t_quantile(power, df)
    return quantiles * difference.sd / math.sqrt(difference.n)


def regularized_lower_gamma(a: float, x: float) -> float:
    """P(a, x), the regularized lower incomplete gamma function, for a > 0 and x >= 0 (its series below x < a + 1, the
    continued fraction of Q = 1 - P above; Numerical Recipes ``gammp``)."""
    if not a > 0 or x < 0:
        raise ValueError(f"incomplete gamma: need a > 0 and x >= 0, got a={a}, x={x}")
    if x == 0:
        return 0.0
    log_front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        for n in range(1, 1000):
            term *= x / (a + n)
            total += term
            if abs(term) < abs(total) * 1e-16:
                break
        return total * math.exp(log_front)
    b = x + 1.0 - a  # Q(a, x) by the modified Lentz continued fraction
    c, d = 1.0 / _TINY, 1.0 / b
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = b + an / c
        c = c if abs(c) > _TINY else _TINY
        h *= d * c
        if abs(d * c - 1.0) < 1e-16:
            break
    return 1.0 - math.exp(log_front) * h


def chi2_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of the chi-square distribution with ``df`` degrees of freedom (bisection on P(df / 2, x /
    2))."""
    if not 0.0 < p < 1.0 or not df > 0:
        raise ValueError(f"chi-square quantile: need 0 < p < 1 and df > 0, got p={p}, df={df}")
    low, high = 0.0, max(1.0, df)
    while regularized_lower_gamma(df / 2.0, high / 2.0) < p:
        high *= 2.0
    for _ in range(200):
        middle = (low + high) / 2.0
        if regularized_lower_gamma(df / 2.0, middle / 2.0) < p:
            low = middle
        else:
            high = middle
    return (low + high) / 2.0


def detectable_at_upper_spread(difference: Estimate, power: float = 0.8) -> float:
    """:func:`detectable_difference` with the spread at the upper bound of its two-sided ``level`` interval, ``sd *
    sqrt((n - 1) / chi2_{(1-level)/2, n-1})``: what the seeds could detect if the true spread were as large as the
    observed one allows. NaN with fewer than 2 seeds."""
    if difference.n < 2:
        return math.nan
    df = difference.n - 1
    upper = difference.sd * math.sqrt(df / chi2_quantile((1.0 - difference.level) / 2.0, df))
    return detectable_difference(replace(difference, sd=upper), power)


def relative_change(method: Mapping[int, float], baseline: Mapping[int, float]) -> float:
    """``mean(method - baseline) / mean(baseline)`` over the common seeds (a fraction; NaN if undefined)."""
    seeds = common_seeds(method, baseline)
    if not seeds:
        return math.nan
    base = math.fsum(baseline[s] for s in seeds) / len(seeds)
    if base == 0:
        return math.nan
    return math.fsum(method[s] - baseline[s] for s in seeds) / len(seeds) / base


def mcnemar_exact(gained: int, lost: int) -> float:
    """The two-sided exact McNemar p-value of ``gained`` examples right only in one run and ``lost`` right only in the
    other: the binomial probability, at 1/2, of a split at least as uneven, doubled and capped at 1 (1.0 when no
    example changed)."""
    if gained < 0 or lost < 0:
        raise ValueError(f"McNemar: counts must be >= 0, got {gained} and {lost}")
    n = gained + lost
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(gained, lost) + 1)) / 2**n
    return min(1.0, 2 * tail)


@dataclass(frozen=True)
class PairedOutcomes:
    """Two runs' outcomes on the same examples: how many only the second got right (``gained``), only the first
    (``lost``), and the exact McNemar p-value of that split."""

    examples: int
    gained: int
    lost: int

    @property
    def p_value(self) -> float:
        return mcnemar_exact(self.gained, self.lost)


def paired_outcomes(first: str, second: str) -> PairedOutcomes:
    """Compare two strings of per-example outcomes (``1`` right, ``0`` wrong, the same examples in the same order)."""
    if len(first) != len(second):
        raise ValueError(f"paired outcomes: {len(first)} and {len(second)} examples")
    gained = sum(a == "0" and b == "1" for a, b in zip(first, second))
    lost = sum(a == "1" and b == "0" for a, b in zip(first, second))
    return PairedOutcomes(len(first), gained, lost)


def t_test_p(difference: Estimate) -> float:
    """The two-sided p-value of the t test that ``difference``'s true mean is 0 (t = mean / (sd / sqrt(n)), n - 1
    degrees of freedom); NaN with fewer than 2 values, 0 or 1 when the spread is 0."""
    if difference.n < 2 or not math.isfinite(difference.sd):
        return math.nan
    if difference.sd == 0:
        return 1.0 if difference.mean == 0 else 0.0
    t = abs(difference.mean) / (difference.sd / math.sqrt(difference.n))
    return min(1.0, 2.0 * (1.0 - t_cdf(t, difference.n - 1)))


def holm_adjusted(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: the i-th smallest of m is multiplied by m - i + 1, then
    made non-decreasing in that order and capped at 1. A contrast is significant at family-wise level a when its
    adjusted p is at most a. NaN entries stay NaN and do not count in m."""
    order = sorted((p, i) for i, p in enumerate(p_values) if math.isfinite(p))
    adjusted = [math.nan] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p))
        adjusted[i] = running
    return adjusted


def cluster_means(
    method: Mapping[int, float], baseline: Mapping[int, float], cluster_of: Callable[[int], int]
) -> list[float]:
    """Per cluster (``cluster_of(seed)``, e.g. the seed's start policy; in cluster order) the mean of its seeds' paired
    differences ``method[s] - baseline[s]`` over the common seeds."""
    by_cluster: dict[int, list[float]] = {}
    for seed in common_seeds(method, baseline):
        by_cluster.setdefault(cluster_of(seed), []).append(method[seed] - baseline[seed])
    return [math.fsum(v) / len(v) for _, v in sorted(by_cluster.items())]


def cluster_difference(
    method: Mapping[int, float],
    baseline: Mapping[int, float],
    cluster_of: Callable[[int], int],
    level: float = 0.95,
) -> Estimate:
    """The paired difference over clusters: the mean and t interval of the :func:`cluster_means` (clusters - 1 degrees
    of freedom). Seeds of one start policy are not independent replicates of the start policy's effect."""
    return mean_ci(cluster_means(method, baseline, cluster_of), level)


def detectable_at_lower_spread(difference: Estimate, power: float = 0.8) -> float:
    """:func:`detectable_difference` with the spread at the lower bound of its two-sided ``level`` interval, ``sd *
    sqrt((n - 1) / chi2_{(1+level)/2, n-1})``: the most optimistic reading. NaN with fewer than 2 values."""
    if difference.n < 2:
        return math.nan
    df = difference.n - 1
    lower = difference.sd * math.sqrt(df / chi2_quantile((1.0 + difference.level) / 2.0, df))
    return detectable_difference(replace(difference, sd=lower), power)
