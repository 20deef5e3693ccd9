"""The statistics of the report: percentiles, spread, Jain's index, max/min.

Medians are the stdlib's (``statistics``); what it does not have is here,
percentiles included (it has none between whole percents, such as p99.9).
Pure functions, unit-tested in tests/test_benchmarks.py.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentiles(values: Sequence[float], *qs: float) -> list[float]:
    """The *qs*-th percentiles (each above 0 and below 100: 50, 99, 99.9) of
    *values*, interpolated between ranks as numpy's default ("linear") does,
    so p50 is the median: the q-th sits at rank q / 100 x (n - 1) of the
    sorted values.  (``statistics.quantiles`` cuts at whole percents only.)
    """
    if not values:
        raise ValueError("percentiles of no values")
    if any(not 0 < q < 100 for q in qs):
        raise ValueError(f"percentiles {qs!r}: each must be above 0 and below 100")
    ordered = sorted(values)
    out = []
    for q in qs:
        rank = q / 100 * (len(ordered) - 1)
        low = math.floor(rank)
        high = min(low + 1, len(ordered) - 1)
        out.append(ordered[low] + (ordered[high] - ordered[low]) * (rank - low))
    return [float(v) for v in out]


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
