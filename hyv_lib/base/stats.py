"""Rates counted over a few dozen prompts: their confidence intervals (Wilson) and binomial pass chances."""

from __future__ import annotations

import math
from statistics import NormalDist

from .errors import HyvInputError


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval (Wilson 1927; Newcombe 1998, method 3) for a binomial rate of ``successes`` in
    ``trials``, as fractions (low, high). Unlike the normal-approximation interval it stays inside [0, 1] and keeps
    its coverage near 0 and 1, where accuracies of 85-95% on 45 prompts sit. scipy gives the same
    (``scipy.stats.binomtest(k, n).proportion_ci(method="wilson")``), but it is not a dependency of ``hyv_lib``."""
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise HyvInputError("trials", f"must be a positive integer, got {trials!r}")
    if isinstance(successes, bool) or not isinstance(successes, int) or not 0 <= successes <= trials:
        raise HyvInputError("successes", f"must be an integer in 0..`trials` ({trials}), got {successes!r}")
    if not 0 < confidence < 1:
        raise HyvInputError("confidence", f"must be between 0 and 1, got {confidence!r}")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p, n = successes / trials, trials
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def rate_counts(rate: float, trials: int) -> int:
    """The number of successes behind a ``rate`` measured over ``trials`` (a rate stored as a fraction)."""
    successes = round(rate * trials)
    if abs(successes - rate * trials) > 1e-6 * trials or not 0 <= successes <= trials:
        raise HyvInputError("rate", f"{rate!r} is not a count out of `trials` ({trials})")
    return int(successes)


def at_least_chance(k: int, n: int, p: float) -> float:
    """P(at least ``k`` of ``n`` right) when each is right with probability ``p``, independently: the binomial tail
    ``sum_{j >= k} C(n, j) p^j (1 - p)^(n - j)`` (scipy's ``binom.sf(k - 1, n, p)``)."""
    if not 0 <= k <= n:
        raise HyvInputError("k", f"must be in 0..{n}, got {k}")
    if not 0 <= p <= 1:
        raise HyvInputError("p", f"must be a probability in [0, 1], got {p}")
    return sum(math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(k, n + 1))
