"""benchmarks/fairness.py: one short run per loop, schema and sane numbers;
and ``python -m benchmarks fairness`` through the shared runner and report.

Forks two workers and a client process; a fraction of a second each, so the
whole file stays under thirty seconds.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.harness import maths, processes
from benchmarks.workloads import fairness, report, runner

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")


@pytest.mark.bench
@pytest.mark.timeout(30)
@pytest.mark.parametrize("loop", ["asyncio", "relaxed-balanced"])
@pytest.mark.parametrize(("mode", "placement"), [
    ("close", "pinned"), ("keepalive", "pinned"), ("mixed", "unpinned")])
def test_run_once_schema_and_numbers(loop: str, mode: str, placement: str) -> None:
    result = fairness.run_once(loop, workers=2, concurrency=4, mode=mode,
                               duration=0.3, warmup=0.1, placement=placement)
    assert set(result) >= {"metrics", "per_worker", "client", "pinned", "placement"}
    assert result["placement"] == placement
    if placement == "unpinned":
        assert result["pinned"] is False
    metrics = result["metrics"]
    assert isinstance(metrics, dict)
    assert set(metrics) == set(fairness.METRICS)
    for name, value in metrics.items():
        assert isinstance(value, float), name
        if name == "max_min" and value == math.inf:
            continue  # one worker served nothing in so short a window
        assert math.isfinite(value) and value > 0, (name, value)
    per_worker = result["per_worker"]
    assert isinstance(per_worker, dict)
    assert set(per_worker) == {"connections", "requests", "cpu_s", "p99_us"}
    assert all(len(values) == 2 for values in per_worker.values())
    assert all(isinstance(n, int) and n >= 0 for n in per_worker["connections"])
    # The indices are over what the workers reported (with two workers any
    # split lies in [0.5, 1]: a bound alone could not fail).
    assert metrics["jain"] == pytest.approx(maths.jain(per_worker["connections"]))
    assert metrics["jain_requests"] == pytest.approx(maths.jain(per_worker["requests"]))
    if mode == "close":
        # One request per connection: a worker's counts differ only by the
        # requests in flight at the two window marks, at most one per client each.
        for conns, reqs in zip(per_worker["connections"], per_worker["requests"], strict=True):
            assert abs(conns - reqs) <= 2 * 4, per_worker
    assert all(t >= 0 for t in per_worker["cpu_s"])
    # The reply names its worker: a worker the client heard from in its
    # window has its own p99 (None: none in the window).
    assert all(p99 is None or (math.isfinite(p99) and p99 > 0) for p99 in per_worker["p99_us"])
    assert any(p99 is not None for p99 in per_worker["p99_us"])
    # Not requests >= connections: a window mark can fall between a
    # connection_made and its request.
    assert sum(per_worker["requests"]) > 0 and sum(per_worker["connections"]) > 0
    assert isinstance(result["client"], str) and result["client"]
    assert isinstance(result["pinned"], bool)


def test_missing_loop_is_a_lookup_error() -> None:
    with pytest.raises(LookupError):
        fairness.run_once("no-such-loop", workers=2, concurrency=1, mode="close",
                          duration=0.1)


def test_bad_mode_placement_or_mixed_with_one_client_fail_before_forking() -> None:
    for options in ({"mode": "sometimes"}, {"mode": "close", "placement": "elsewhere"},
                    {"mode": "mixed", "concurrency": 1}):
        with pytest.raises(ValueError):
            fairness.run_once("asyncio", **{"workers": 2, "concurrency": 4,
                                            "duration": 0.1, **options})


def test_mixed_lifetimes_keep_some_connections_for_the_whole_run() -> None:
    assert fairness._lifetimes("close", 3) == [1, 1, 1]
    assert fairness._lifetimes("keepalive", 2) == [fairness.KEEPALIVE_REQUESTS] * 2
    assert fairness._lifetimes("mixed", 10) == [None] * 5 + [1] * 5
    assert fairness._lifetimes("mixed", 2) == [None, 1]
    assert fairness._lifetimes("mixed", 3).count(None) in (1, 2)


@pytest.mark.bench
@pytest.mark.timeout(60)
def test_the_fairness_command_reports_like_a_run(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "fairness", "--loops", "asyncio,relaxed-batch",
         "--workers", "2", "--concurrency", "2", "--mode", "close,keepalive",
         "--duration", "0.3", "--warmup", "0.1", "--repeat", "2", "--no-charts",
         "--results", str(tmp_path)],
        cwd=processes.ROOT, capture_output=True, text=True, timeout=50,
    )
    assert proc.returncode == 0, proc.stderr
    assert "[1/8 " in proc.stderr and "[8/8 " in proc.stderr  # progress, run by run
    (path,) = tmp_path.glob("*.json")
    doc = json.loads(path.read_text())
    assert doc["schema"] == runner.SCHEMA and doc["method"]["repeat"] == 2
    assert doc["command"][1:3] == ["fairness", "--loops"]
    assert [e["name"] for e in doc["workloads"]] == ["fairness-k2-c2-close",
                                                     "fairness-k2-c2-keepalive"]
    for entry in doc["workloads"]:
        assert entry["errors"] == {}, entry["name"]
        assert set(entry["loops"]) == {"asyncio", "relaxed-batch"}
        for data in entry["loops"].values():
            assert len(data["samples"]) == 2
            assert set(data["median"]) >= set(fairness.METRICS) - {"max_min"}
            # Each sample's index is over its workers' connections, and the
            # table's figure is the median of the samples'.
            for sample in data["samples"]:
                assert sample["jain"] == pytest.approx(
                    maths.jain(sample["per_worker"]["connections"]))
            assert data["median"]["jain"] == pytest.approx(
                statistics.median(s["jain"] for s in data["samples"]))
        header, rows = report.rows(entry)
        assert header[-1] == "conn/s vs batch"
        assert rows[1][-1] == f"1.00{report.TIMES}"  # relaxed-batch over itself
    # The same tables and summary as a run: relaxed-batch is our default.
    assert "conn/s vs batch" in proc.stdout
    summary = proc.stdout[proc.stdout.index("Summary ("):]
    assert "fairness-k2-c2-close" in summary and "relaxed-batch" in summary
    assert (tmp_path / path.with_suffix(".md").name).read_text().count("## fairness-") == 2
