"""The echo example runs for real: a server process per loop and a client."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.parametrize("api", ["protocol", "buffered", "streams"])
def test_echo_compare_prints_a_row_per_loop(api: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "echo_server.py"), "compare",
         "--loops", "asyncio,relaxed-eager,relaxed-deferred", "--api", api,
         "--duration", "0.3", "--repeat", "1", "--clients", "4"],
        capture_output=True, text=True, env=env, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    table = json.loads(out.stdout.splitlines()[-1])["loops"]  # the medians, by name
    assert set(table) == {"asyncio", "relaxed-eager", "relaxed-deferred"}
    for name, row in table.items():
        assert row["req_per_s"] > 0 and row["cpu_us_per_request"] > 0, (name, row)
        assert 0 < row["p50_us"] <= row["p99_us"], (name, row)
    assert table["asyncio"]["syscalls_per_request"] is None  # statistics() is ours only
    for name in ("relaxed-eager", "relaxed-deferred"):
        row = table[name]
        # An echoed request is at least one recv and one send on the server
        # (plus its share of the polls); fewer means the counters or the
        # per-request division broke, many more that the run did not echo.
        assert 2.0 <= row["syscalls_per_request"] <= 6.0, (name, row)
        # One data_received per request (a few more: connections made and lost).
        assert 0.9 <= row["callbacks_per_request"] <= 3.0, (name, row)
    # The table above the JSON names the same loops, in the same order.
    lines = out.stdout.splitlines()
    assert [line.split()[0] for line in lines[2:-1]] == list(table)


@pytest.mark.slow
@pytest.mark.parametrize(
    "flags", [["--loop", "asyncio"], ["--loop", "relaxed", "--accept", "single"],
              ["--loop", "relaxed", "--accept", "relaxed"]],
    ids=["asyncio", "relaxed-single", "relaxed-relaxed"],
)
def test_prefork_workers_share_one_socket(flags: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "prefork_server.py"), "--workers", "2",
         "--port", "0", "--load", "100", *flags],
        capture_output=True, text=True, env=env, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.splitlines()[-1])
    connections, requests = summary["connections"], summary["requests"]
    assert sum(connections) == 100  # every connection served, by some worker
    assert len(connections) == 2
    # --load makes one request per connection: each worker's counts agree.
    assert requests == connections
    # The index printed is Jain's over those counts (with two workers any
    # split lies in [0.5, 1], so the bound alone could not fail).
    assert summary["jain"] == pytest.approx(
        sum(connections) ** 2 / (2 * sum(c * c for c in connections)))
