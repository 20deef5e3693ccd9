"""The statistics of the report: medians, percentiles, spread, Jain's index.

Pure functions, unit-tested in tests/test_benchmarks.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def median(values: Sequence[float]) -> float:
    """The median of *values* (the mean of the middle two for an even count)."""
    if not values:
        raise ValueError("median of no values")
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return float(ordered[mid])
    return (ordered[mid - 1] + ordered[mid]) / 2


def percentile(values: Sequence[float], q: float) -> float:
    """The *q*-th percentile (0-100) by linear interpolation between ranks.

    The same definition as numpy's default ("linear"), so p50 is the median.
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q={q!r} is not within 0..100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def spread(values: Sequence[float]) -> float:
    """(max - min) / median of the repeats: the noise band of a median."""
    mid = median(values)
    if mid == 0:
        return 0.0
    return (max(values) - min(values)) / abs(mid)


def jain(shares: Sequence[float]) -> float:
    """Jain's fairness index: (sum x)^2 / (n * sum x^2).

    1.0 when every worker got the same share, 1/n when one got everything.
    """
    if not shares:
        raise ValueError("Jain's index of no shares")
    total = sum(shares)
    squares = sum(x * x for x in shares)
    if squares == 0:
        return 1.0  # nobody got anything: equally nothing
    return total * total / (len(shares) * squares)


def max_min(shares: Sequence[float]) -> float:
    """The largest share over the smallest (inf when a worker got nothing)."""
    if not shares:
        raise ValueError("max/min of no shares")
    low = min(shares)
    return math.inf if low == 0 else max(shares) / low
