"""The CI arithmetic on hand-made numbers: t quantiles against published table values, mean +- CI
and paired differences computed by hand."""

import math

import pytest

from tokenbalance.ablate.stats import (
    detectable_difference,
    mean_ci,
    paired_difference,
    regularized_incomplete_beta,
    relative_change,
    t_cdf,
    t_quantile,
)

# two-sided 95% (p = 0.975) Student t quantiles, from any statistics table
T975 = {1: 12.706204736, 2: 4.302652730, 3: 3.182446305, 4: 2.776445105, 9: 2.262157163, 30: 2.042272456}


@pytest.mark.parametrize("df, expected", sorted(T975.items()))
def test_t_quantile_matches_tables(df, expected):
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=1e-8)
    assert t_quantile(0.025, df) == pytest.approx(-expected, abs=1e-8)


def test_t_quantile_closed_forms_and_limits():
    # df = 1 is the Cauchy distribution: quantile tan(pi (p - 1/2)); df = 2: (2p - 1) / sqrt(2 p (1 - p))
    for p in (0.6, 0.9, 0.99):
        assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-10)
        assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-10)
    assert t_quantile(0.975, 10**6) == pytest.approx(1.959964, abs=1e-5)  # the normal's
    assert t_quantile(0.5, 3) == 0.0 and t_cdf(0.0, 7) == 0.5
    assert t_cdf(t_quantile(0.8, 5), 5) == pytest.approx(0.8, abs=1e-12)
    assert regularized_incomplete_beta(1.0, 1.0, 0.3) == pytest.approx(0.3)  # uniform
    assert regularized_incomplete_beta(2.5, 2.5, 0.5) == pytest.approx(0.5)  # symmetric
    with pytest.raises(ValueError, match="p must be in"):
        t_quantile(1.0, 3)


def test_mean_ci_of_three_seeds_by_hand():
    # mean 0.35, sd 0.05 (deviations -0.05, 0, 0.05; / (n - 1) = 2), half-width t(0.975, 2) * 0.05 / sqrt(3)
    e = mean_ci([0.30, 0.35, 0.40])
    assert (e.n, e.mean, e.sd) == (3, pytest.approx(0.35), pytest.approx(0.05))
    assert e.half_width == pytest.approx(4.302652730 * 0.05 / math.sqrt(3))  # = 0.124207
    assert e.half_width == pytest.approx(0.1242069, abs=1e-7)
    assert e.low == pytest.approx(0.35 - 0.1242069, abs=1e-7) and e.excludes_zero
    single = mean_ci([0.4])
    assert single.n == 1 and single.mean == 0.4 and math.isnan(single.half_width)
    assert mean_ci([]).n == 0 and math.isnan(mean_ci([]).mean)


def test_paired_difference_uses_the_common_seeds_by_hand():
    method = {0: 0.40, 1: 0.38, 2: 0.45, 7: 0.99}  # seed 7 has no baseline: left out
    baseline = {0: 0.30, 1: 0.35, 2: 0.40, 5: 0.10}
    d = paired_difference(method, baseline)
    # differences 0.10, 0.03, 0.05: mean 0.06, sd sqrt((0.04^2 + 0.03^2 + 0.01^2) / 2) = sqrt(0.0013)
    assert d.n == 3 and d.mean == pytest.approx(0.06)
    assert d.sd == pytest.approx(math.sqrt(0.0013))
    assert d.half_width == pytest.approx(4.302652730 * math.sqrt(0.0013) / math.sqrt(3))  # 0.089567
    assert d.low == pytest.approx(0.06 - 0.0895669, abs=1e-6) and not d.excludes_zero
    # the paired interval is narrower than the unpaired one when seeds move together
    assert d.half_width < mean_ci([0.40, 0.38, 0.45]).half_width + mean_ci([0.30, 0.35, 0.40]).half_width
    # relative change: mean difference / baseline mean over the same seeds = 0.06 / 0.35
    assert relative_change(method, baseline) == pytest.approx(0.06 / 0.35)
    clear = paired_difference({0: 0.5, 1: 0.6, 2: 0.55}, {0: 0.4, 1: 0.5, 2: 0.46})
    assert clear.excludes_zero  # differences 0.10, 0.10, 0.09


def test_detectable_difference_by_hand():
    # three seeds, differences 0.01, 0.03, 0.02: sd 0.01; t(0.975, 2) = 0.95 / sqrt(2 * 0.975 * 0.025) and
    # t(0.80, 2) = 0.6 / sqrt(2 * 0.8 * 0.2) (df = 2: t_p = (2p - 1) / sqrt(2p(1 - p)))
    d = paired_difference({0: 0.31, 1: 0.33, 2: 0.32}, {0: 0.3, 1: 0.3, 2: 0.3})
    t975, t80 = 0.95 / math.sqrt(0.04875), 0.6 / math.sqrt(0.32)
    assert detectable_difference(d) == pytest.approx((t975 + t80) * 0.01 / math.sqrt(3), rel=1e-9)  # 0.030965
    assert detectable_difference(d, power=0.5) == pytest.approx(d.half_width, rel=1e-9)  # t(0.5) = 0
    assert math.isnan(detectable_difference(paired_difference({0: 0.4}, {0: 0.3})))


def test_chi_square_quantiles_match_the_tables():
    from tokenbalance.ablate.stats import chi2_quantile, regularized_lower_gamma

    # published values (e.g. NIST/SEMATECH e-Handbook, table of the chi-square distribution)
    for p, df, expected in ((0.025, 7, 1.690), (0.975, 7, 16.013), (0.05, 2, 0.103), (0.025, 50, 32.357)):
        assert abs(chi2_quantile(p, df) - expected) < 5e-4, (p, df)
    assert abs(chi2_quantile(0.05, 2) - (-2 * math.log(0.95))) < 1e-12  # df 2: exponential, closed form
    assert abs(regularized_lower_gamma(1.0, 2.0) - (1 - math.exp(-2.0))) < 1e-14  # both branches of P
    assert abs(regularized_lower_gamma(1.0, 0.3) - (1 - math.exp(-0.3))) < 1e-14


def test_detectable_difference_at_the_upper_bound_of_the_spread():
    from tokenbalance.ablate.stats import Estimate, detectable_at_upper_spread, detectable_difference

    d = Estimate(8, 0.001, 0.004, 0.003)
    factor = math.sqrt(7 / 1.6898691806773543)  # sqrt((n - 1) / chi2_{0.025, 7}) = 2.035
    assert abs(detectable_at_upper_spread(d) - factor * detectable_difference(d)) < 1e-9
    assert math.isnan(detectable_at_upper_spread(Estimate(1, 0.0, math.nan, math.nan)))
