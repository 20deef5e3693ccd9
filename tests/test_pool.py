"""A pool's snapshots: what a loop publishes (_publish), what readers make
of a directory of them (pool, the top view's rows), and the one scrape of a
pool (metrics.PoolCollector) against the workers' own statistics."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pathlib
import platform
import socket
import subprocess
import sys
import time
from typing import Any

import pytest

import asyncio_relaxed
from asyncio_relaxed import _publish, _top, pool
from asyncio_relaxed._stats import COUNTERS, GAUGES

HERE = pathlib.Path(__file__).resolve().parent


def published(directory: pathlib.Path) -> dict[str, Any]:
    return json.loads((directory / f"relaxed-{os.getpid()}.json").read_text())


def test_a_loop_publishes_when_made_and_removes_its_file_when_closed(tmp_path: pathlib.Path,
                                                                     ) -> None:
    loop = asyncio_relaxed.new_event_loop(stats_dir=str(tmp_path), accept="balanced")
    try:
        snapshot = published(tmp_path)
        assert snapshot["format"] == _publish.FORMAT and snapshot["pid"] == os.getpid()
        assert snapshot["version"] == asyncio_relaxed.__version__
        assert snapshot["settings"]["accept"] == "balanced"
        assert snapshot["settings"]["stats_dir"] == str(tmp_path)
        assert snapshot["backend"] == loop.statistics().backend
        assert set(snapshot["statistics"]) == set(COUNTERS)
        assert set(snapshot["gauges"]) == set(GAUGES)
        assert snapshot["process_start"] == _publish.process_start(os.getpid())
        assert abs(snapshot["time"] - time.time()) < 60
        assert os.listdir(tmp_path) == [f"relaxed-{os.getpid()}.json"]  # no .tmp left
        # With time_metrics the loop publishes where it reads the clock
        # before a wait: no timer of its own.
        assert loop._scheduled == []
    finally:
        loop.close()
    assert os.listdir(tmp_path) == []


def test_without_time_metrics_a_timer_publishes(tmp_path: pathlib.Path) -> None:
    loop = asyncio_relaxed.new_event_loop(stats_dir=str(tmp_path), time_metrics=False)
    publisher = loop._health.publisher
    try:
        assert published(tmp_path)["health"]["time_metrics"] is False
        assert [h._callback for h in loop._scheduled] == [publisher.tick]
    finally:
        loop.close()
    assert os.listdir(tmp_path) == []
    assert publisher.timer is None
    assert [h for h in loop._scheduled if not h.cancelled()] == []


def test_without_stats_dir_nothing_is_scheduled_or_written(tmp_path: pathlib.Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           ) -> None:
    monkeypatch.chdir(tmp_path)
    loop = asyncio_relaxed.new_event_loop()
    try:
        assert loop._health.publisher is None
        assert loop._scheduled == []
    finally:
        loop.close()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("time_metrics", [True, False])
def test_the_loop_publishes_every_interval_with_the_window(tmp_path: pathlib.Path,
                                                          time_metrics: bool) -> None:
    """Busy, then idle (waiting with nothing scheduled): a snapshot every
    interval either way."""
    loop = asyncio_relaxed.new_event_loop(stats_dir=str(tmp_path), time_metrics=time_metrics)

    async def serve_and_read() -> None:
        server = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        for _ in range(3):
            _r, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            await writer.wait_closed()
        # Idle: nothing scheduled but this task's wake-up, far off.
        idle = loop.create_future()
        loop.call_later(_publish.INTERVAL * 2.5, idle.set_result, None)
        await idle
        server.close()
        await server.wait_closed()

    try:
        first = published(tmp_path)["time"]
        loop.run_until_complete(asyncio.wait_for(serve_and_read(), 20))
        snapshot = published(tmp_path)
    finally:
        loop.close()
    assert snapshot["time"] > first + _publish.INTERVAL
    window = snapshot["window"]
    assert 0.5 * _publish.INTERVAL < window["seconds"] < 10 * _publish.INTERVAL
    assert 0.0 <= window["utilisation"] <= 1.0
    assert window["iterations_per_second"] > 0
    history = snapshot["history"]
    assert 2 <= len(history["utilisation"]) == len(history["accepts"]) <= _publish.HISTORY
    assert sum(history["accepts"]) == 3  # the three connections, in some interval
    assert snapshot["listeners"][0]["accepted"] == 3


def test_a_second_loop_of_the_process_publishes_nothing_and_says_so(
        tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    first = asyncio_relaxed.new_event_loop(stats_dir=str(tmp_path))
    try:
        with caplog.at_level(logging.WARNING, logger="asyncio_relaxed"):
            second = asyncio_relaxed.new_event_loop(stats_dir=str(tmp_path))
        try:
            assert "publishes nothing" in caplog.text
            assert second._scheduled == []
            before = published(tmp_path)
        finally:
            second.close()
        assert published(tmp_path) == before  # the first's file stays
    finally:
        first.close()
    assert os.listdir(tmp_path) == []
    third = asyncio_relaxed.new_event_loop(stats_dir=str(tmp_path))  # the first is closed
    try:
        assert published(tmp_path)["pid"] == os.getpid()
    finally:
        third.close()


def test_a_failed_write_is_logged_once_and_retried(tmp_path: pathlib.Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    directory = tmp_path / "pool"
    directory.mkdir()
    loop = asyncio_relaxed.new_event_loop(stats_dir=str(directory))
    publisher = loop._health.publisher
    try:
        (directory / f"relaxed-{os.getpid()}.json").unlink()
        directory.rmdir()
        with caplog.at_level(logging.WARNING, logger="asyncio_relaxed"):
            publisher.tick()
            publisher.tick()
        assert caplog.text.count("cannot publish statistics") == 1
        assert publisher.next_at > time.monotonic()  # the next try is due
        directory.mkdir()
        publisher.tick()
        assert published(directory)["pid"] == os.getpid()
    finally:
        loop.close()


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _write(directory: pathlib.Path, pid: int, **fields: Any) -> pathlib.Path:
    loop = asyncio_relaxed.new_event_loop()
    try:
        document = {"format": _publish.FORMAT, "pid": pid, "process_start": None,
                    "started": time.time(), "interval": _publish.INTERVAL,
                    **_publish.document(loop),
                    "window": {"seconds": 1.0, "utilisation": 0.25, "lag_p50": 0.0,
                               "lag_p99": 0.0, "accepts_per_second": 0.0,
                               "reads_per_second": 0.0, "iterations_per_second": 1.0},
                    "history": {"utilisation": [0.25], "accepts": [0]}}
    finally:
        loop.close()
    document.update(fields)
    path = directory / f"relaxed-{pid}.json"
    path.write_text(json.dumps(document))
    return path


def test_a_dead_processs_file_is_dropped_and_deleted(tmp_path: pathlib.Path) -> None:
    dead = _write(tmp_path, _dead_pid())
    alive = _write(tmp_path, os.getpid(), process_start=_publish.process_start(os.getpid()))
    assert [worker.pid for worker in pool.read(str(tmp_path))] == [os.getpid()]
    assert not dead.exists() and alive.exists()


def test_a_reused_pid_is_a_dead_worker(tmp_path: pathlib.Path) -> None:
    """Our pid, but a start time that is not ours: the writer died and the
    pid went to this process."""
    start = _publish.process_start(os.getpid())
    if start is None:
        pytest.skip("no /proc/<pid>/stat here: a reused pid cannot be told")
    path = _write(tmp_path, os.getpid(), process_start=start - 1)
    assert pool.read(str(tmp_path)) == []
    assert not path.exists()


def test_a_new_publisher_sweeps_the_dead(tmp_path: pathlib.Path) -> None:
    dead = _write(tmp_path, _dead_pid())
    loop = asyncio_relaxed.new_event_loop(stats_dir=str(tmp_path))
    try:
        assert not dead.exists()
    finally:
        loop.close()


def test_an_old_snapshot_of_a_live_process_is_stale(tmp_path: pathlib.Path) -> None:
    _write(tmp_path, os.getpid(), time=time.time() - pool.STALE_AFTER - 1)
    (worker,) = pool.read(str(tmp_path))
    assert worker.stale and worker.age > pool.STALE_AFTER
    _write(tmp_path, os.getpid())
    (worker,) = pool.read(str(tmp_path))
    assert not worker.stale


def test_unreadable_and_foreign_files_are_left_out(tmp_path: pathlib.Path) -> None:
    (tmp_path / f"relaxed-{os.getpid()}.json").write_text("{not json")
    (tmp_path / "relaxed-12x.json").write_text("{}")
    (tmp_path / "other.json").write_text("{}")
    _write(tmp_path, 1, format=_publish.FORMAT + 1)  # pid 1 lives; another format
    assert pool.read(str(tmp_path)) == []
    assert len(os.listdir(tmp_path)) == 4  # nothing of theirs deleted
    with pytest.raises(FileNotFoundError, match="stats_dir"):
        pool.read(str(tmp_path / "missing"))


def test_jain() -> None:
    assert pool.jain([5, 5, 5, 5]) == 1.0
    assert pool.jain([8, 0, 0, 0]) == pytest.approx(0.25)
    assert pool.jain([3, 1]) == pytest.approx(16 / 20)
    assert pool.jain([]) == 1.0 and pool.jain([0, 0]) == 1.0


def test_sparkline() -> None:
    assert _top.sparkline([0.0, 0.5, 1.0], 5) == "  ▁▅█"
    assert _top.sparkline([1.0] * 70, 60) == "█" * 60
    assert _top.sparkline([-1.0, 2.0], 2) == "▁█"


def test_top_rows_and_summary_of_two_workers(tmp_path: pathlib.Path) -> None:
    _write(tmp_path, os.getpid(), history={"utilisation": [0.5], "accepts": [3]})
    _write(tmp_path, 1, history={"utilisation": [0.1], "accepts": [1]})  # pid 1 runs
    workers = pool.read(str(tmp_path))
    table = _top.rows(workers)
    assert [row["pid"] for row in table] == sorted([1, os.getpid()])
    line = _top.summary(table)
    assert line["workers"] == 2 and line["stale_workers"] == 0
    assert line["jain_accepts_last_minute"] == pytest.approx(pool.jain([3, 1]))


# -- the pool in one scrape --------------------------------------------------------


def _metric_samples(collector: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    samples = {}
    for family in collector.collect():
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


@pytest.mark.slow
def test_pool_collector_against_the_workers_own_statistics(tmp_path: pathlib.Path) -> None:
    """Three processes serve one listening socket, each publishing; a scrape
    of the directory gives each worker's counters and gauges as its own loop
    reports them at the moment it published, and the pool's sums."""
    pytest.importorskip("prometheus_client")
    from asyncio_relaxed.metrics import PoolCollector

    listener = socket.create_server(("127.0.0.1", 0), backlog=128)
    port = listener.getsockname()[1]
    workers = [
        subprocess.Popen(
            [sys.executable, str(HERE / "_pool_worker.py"), str(listener.fileno()), str(tmp_path),
             "accept=balanced"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            pass_fds=[listener.fileno()], cwd=HERE.parent)
        for _ in range(3)
    ]
    try:
        for worker in workers:
            assert worker.stdout.readline().strip() == "ready"  # type: ignore[union-attr]
        connections = 60
        for _ in range(connections):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
                client.sendall(b"ping")
                assert client.recv(16) == b"ping"
        time.sleep(0.3)  # the workers see the clients' close
        own = {}
        for worker in workers:
            worker.stdin.write("report\n")  # type: ignore[union-attr]
            worker.stdin.flush()  # type: ignore[union-attr]
            own[worker.pid] = json.loads(worker.stdout.readline())  # type: ignore[union-attr]
        samples = _metric_samples(PoolCollector(str(tmp_path)))
    finally:
        for worker in workers:
            worker.stdin.close()  # type: ignore[union-attr]
        for worker in workers:
            worker.wait(timeout=20)
            worker.stdout.close()  # type: ignore[union-attr]
        listener.close()

    from asyncio_relaxed.metrics import _GAUGES, _OWN, _SYSCALLS, _WOULD_BLOCK

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    for pid, report in own.items():
        stats, gauges = report["statistics"], report["gauges"]
        for counter, name in _OWN.items():
            assert value(f"asyncio_relaxed_{name}_total", pid=str(pid)) == stats[counter]
        for counter, call in _SYSCALLS.items():
            assert value("asyncio_relaxed_syscalls_total", pid=str(pid), call=call) == \
                stats[counter]
        for counter, call in _WOULD_BLOCK.items():
            assert value("asyncio_relaxed_syscalls_would_block_total", pid=str(pid),
                         call=call) == stats[counter]
        for gauge, name in _GAUGES.items():
            if gauge != "pending_accepts":  # read anew at each look
                assert value(f"asyncio_relaxed_{name}", pid=str(pid)) == gauges[gauge]
        (mine,) = report["listeners"]
        address = f"127.0.0.1:{port}"
        assert value("asyncio_relaxed_accepted_connections_total", pid=str(pid),
                     listener=address, strategy="balanced") == mine["accepted"]
        assert value("asyncio_relaxed_info", pid=str(pid), version=asyncio_relaxed.__version__,
                     python=f"{platform.python_implementation()} {platform.python_version()}",
                     backend=stats["backend"], write="eager",
                     partial_write="poll", accept="balanced", exclusive_accept="off",
                     tls="own", poller="auto", time_metrics="on") == 1
        assert value("asyncio_relaxed_snapshot_age_seconds", pid=str(pid)) < 60
    # The pool's sums are the sums of the workers' own figures.
    for counter, name in _OWN.items():
        assert value(f"asyncio_relaxed_pool_{name}_total") == sum(
            report["statistics"][counter] for report in own.values())
    for counter, call in _SYSCALLS.items():
        assert value("asyncio_relaxed_pool_syscalls_total", call=call) == sum(
            report["statistics"][counter] for report in own.values())
    assert value("asyncio_relaxed_pool_accepted_connections_total",
                 listener=f"127.0.0.1:{port}", strategy="balanced") == connections
    assert value("asyncio_relaxed_pool_open_connections") == 0
    assert value("asyncio_relaxed_pool_workers") == 3
    assert value("asyncio_relaxed_pool_stale_workers") == 0
    lag_count = sum(report["health"]["lag_count"] for report in own.values())
    assert value("asyncio_relaxed_pool_lag_seconds_count") == lag_count
    assert not any(name.startswith("asyncio_relaxed_pool_accept_queue") for name, _ in samples)
    assert os.listdir(tmp_path) == []  # each worker removed its file at exit


def test_a_file_of_an_older_worker_without_newer_counters_is_exported(
        tmp_path: pathlib.Path) -> None:
    """A directory may hold a file an older version published (a deploy
    that overlaps): the counters it lacks have no sample of that worker,
    and the scrape and the pool's sums go on."""
    pytest.importorskip("prometheus_client")
    from asyncio_relaxed.metrics import _OWN, _SYSCALLS, pool_families

    start = _publish.process_start(os.getpid())
    path = _write(tmp_path, os.getpid(), process_start=start)
    document = json.loads(path.read_text())
    dropped = {"datagrams_received", "datagram_recv"}
    assert dropped <= set(document["statistics"])
    for counter in dropped:
        del document["statistics"][counter]
    path.write_text(json.dumps(document))
    families = {family.name: family for family in pool_families(pool.read(str(tmp_path)))}
    assert families["asyncio_relaxed_" + _OWN["datagrams_received"]].samples == []
    calls = {labels["call"] for labels, _ in families["asyncio_relaxed_syscalls"].samples}
    assert _SYSCALLS["datagram_recv"] not in calls and "recv" in calls
    assert families["asyncio_relaxed_pool_syscalls"].samples
