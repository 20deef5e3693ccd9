"""The statistics of the report: percentiles, spread, Jain's index, max/min.

Medians and percentiles are the stdlib's (``statistics``); what it does not
have is here.  Pure functions, unit-tested in tests/test_benchmarks.py.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentiles(values: Sequence[float], *qs: int) -> list[float]:
    """The *qs*-th percentiles (each 1-99) of *values*, interpolated between
    ranks as numpy's default ("linear") does, so p50 is the median.

    ``statistics.quantiles``' inclusive method is that interpolation; before
    Python 3.13 it refuses a single value, whose every percentile is itself.
    """
    if not values:
        raise ValueError("percentiles of no values")
    if any(not 1 <= q <= 99 for q in qs):
        raise ValueError(f"percentiles {qs!r}: each must be within 1..99")
    if len(values) == 1:
        return [float(values[0])] * len(qs)
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return [cuts[q - 1] for q in qs]


def spread(values: Sequence[float]) -> float:
    """(max - min) / median of the repeats: the noise band of a median."""
    mid = statistics.median(values)
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
