"""benchmarks/fairness.py: one short run per loop, schema and sane numbers.

Forks two workers and a client process; a fraction of a second each, so the
whole file stays under ten seconds.
"""

from __future__ import annotations

import math
import os

import pytest

from benchmarks import fairness

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")


@pytest.mark.bench
@pytest.mark.timeout(30)
@pytest.mark.parametrize("loop", ["asyncio", "relaxed-balanced"])
@pytest.mark.parametrize("keepalive", [False, True], ids=["close", "keepalive"])
def test_run_once_schema_and_numbers(loop: str, keepalive: bool) -> None:
    result = fairness.run_once(loop, workers=2, concurrency=4, keepalive=keepalive,
                               duration=0.3, warmup=0.1)
    assert set(result) >= {"metrics", "per_worker", "client", "pinned"}
    metrics = result["metrics"]
    assert isinstance(metrics, dict)
    assert set(metrics) == set(fairness.METRICS)
    for name, value in metrics.items():
        assert isinstance(value, float), name
        if name == "max_min" and value == math.inf:
            continue  # one worker served nothing in so short a window
        assert math.isfinite(value) and value > 0, (name, value)
    assert 0.5 <= metrics["jain"] <= 1.0 and 0.5 <= metrics["jain_requests"] <= 1.0
    per_worker = result["per_worker"]
    assert isinstance(per_worker, dict)
    assert len(per_worker["connections"]) == len(per_worker["requests"]) == 2
    assert all(isinstance(n, int) and n >= 0 for n in per_worker["connections"])
    # Not requests >= connections: a window mark can fall between a
    # connection_made and its request.
    assert sum(per_worker["requests"]) > 0 and sum(per_worker["connections"]) > 0
    assert isinstance(result["client"], str) and result["client"]
    assert isinstance(result["pinned"], bool)


def test_missing_loop_is_a_lookup_error() -> None:
    with pytest.raises(LookupError):
        fairness.run_once("no-such-loop", workers=2, concurrency=1, keepalive=False,
                          duration=0.1)
