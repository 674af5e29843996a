"""The Wilson score interval against published and hand-worked values, and its bad input."""

from __future__ import annotations

import pytest

from hyv_lib.base.errors import HyvInputError
from hyv_lib.base.stats import rate_counts, wilson_interval


@pytest.mark.parametrize("k, n, low, high", [
    # Newcombe (1998), "Two-sided confidence intervals for the single proportion", Stat. Med. 17:857-872,
    # Table I, method 3 (score interval without continuity correction), 95%
    (81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605), (0, 20, 0.0, 0.1611), (1, 29, 0.0061, 0.1718)])
def test_wilson_matches_newcombe_1998(k, n, low, high):
    assert wilson_interval(k, n) == pytest.approx((low, high), abs=5e-5)


def test_wilson_by_hand_for_10_of_45():
    """p = 10/45, z = 1.959964, z^2/n = 0.085366: centre (p + z^2/2n) / (1 + z^2/n) = 0.244067, half-width
    z / (1 + z^2/n) * sqrt(p(1-p)/n + z^2/4n^2) = 1.805798 * 0.065690 = 0.118624."""
    assert wilson_interval(10, 45) == pytest.approx((0.12545, 0.36269), abs=2e-5)
    low, high = wilson_interval(45, 45)  # all right: the interval still leaves room below
    assert high == 1.0 and low == pytest.approx(0.9213, abs=1e-4)  # n / (n + z^2) = 45 / 48.8415


def test_wilson_narrows_with_confidence():
    assert wilson_interval(30, 45, 0.9)[0] > wilson_interval(30, 45, 0.95)[0] > wilson_interval(30, 45, 0.99)[0]


def test_rate_counts_recovers_the_count():
    assert rate_counts(40 / 45, 45) == 40 and rate_counts(0.0, 45) == 0
    with pytest.raises(HyvInputError, match="not a count"):
        rate_counts(0.5, 45)


@pytest.mark.parametrize("args, argument", [((3, 0), "trials"), ((5, 4), "successes"), ((-1, 4), "successes"),
                                            ((1.5, 4), "successes"), ((1, 4, 1.0), "confidence")])
def test_wilson_bad_input(args, argument):
    with pytest.raises(HyvInputError) as error:
        wilson_interval(*args)
    assert error.value.argument == argument


def test_at_least_chance_by_hand():
    from hyv_lib.base.stats import at_least_chance

    # 6 of 8 at p = 1/2: (C(8,6) + C(8,7) + C(8,8)) / 256 = (28 + 8 + 1) / 256
    assert at_least_chance(6, 8, 0.5) == pytest.approx(37 / 256)
    assert at_least_chance(0, 8, 0.3) == pytest.approx(1.0) and at_least_chance(8, 8, 0.9) == pytest.approx(0.9 ** 8)
    assert at_least_chance(6, 8, 0.8) == pytest.approx(0.796918, abs=1e-6)  # 0.2936 + 0.3355 + 0.1678
    with pytest.raises(HyvInputError):
        at_least_chance(9, 8, 0.5)
