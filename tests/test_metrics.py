"""asyncio_relaxed.metrics: per-listener accept counts, and the families
exported to Prometheus (scraped over HTTP and parsed with prometheus_client's
own parser) and OpenTelemetry (read through the SDK's in-memory reader)."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from typing import Any

import pytest

import asyncio_relaxed
from asyncio_relaxed import _accept, metrics
from conftest import run


class Idle(asyncio.Protocol):
    def connection_made(self, transport: Any) -> None:
        self.transport = transport


def settle(sock: socket.socket, n: int) -> None:
    """Wait until *sock*'s accept queue holds *n* (where it can be read)."""
    for _ in range(1000):
        queued = _accept.accept_queue_length(sock)
        if queued is None or queued == n:
            return
        time.sleep(0.001)
    raise AssertionError(f"the accept queue never held {n}")


@pytest.mark.skipif(not _accept.QUEUE_LENGTH_KNOWN, reason="Linux only (TCP_INFO)")
def test_listener_statistics_count_exactly() -> None:
    """batch: 3 connections in one event, the queue's length read after the
    first (2 left); balanced: the same, then its rest (holding 3) counted with
    its scheduled seconds, and the rest's end reads the queue empty."""
    for strategy in ("batch", "balanced"):
        loop = asyncio_relaxed.new_event_loop(accept=strategy)
        clients: list[socket.socket] = []
        try:
            server = run(loop, loop.create_server(Idle, "127.0.0.1", 0))
            address = server.sockets[0].getsockname()
            clients = [socket.create_connection(address) for _ in range(3)]
            settle(server.sockets[0]._sock, 3)  # type: ignore[attr-defined]
            loop.run_until_complete(asyncio.sleep(0.01))
            [listener] = loop.listener_statistics()
            assert listener.address == address and listener.strategy == strategy
            assert listener.accepted == 3
            if strategy == "balanced":
                # The end of the rest read the queue again: empty.
                assert (listener.queue_length, listener.queue_length_max) == (0, 2)
                assert listener.rests == 1  # holding 3 after the event
                assert listener.rest_seconds == pytest.approx(3 * _accept.BALANCED_MAX_COOLDOWN)
            else:
                assert (listener.queue_length, listener.queue_length_max) == (2, 2)
                assert (listener.rests, listener.rest_seconds) == (0, 0.0)
            server.close()
            assert loop.listener_statistics() == []
        finally:
            for client in clients:
                client.close()
            # 3.12+'s wait_closed() waits for the connections too.
            run(loop, server.wait_closed())
            loop.close()


def test_families_follow_the_settings() -> None:
    """Busy, idle and lag only with time_metrics; every sample has the pid."""
    for timed in (False, True):
        loop = asyncio_relaxed.new_event_loop(time_metrics=timed)
        try:
            loop.run_until_complete(asyncio.sleep(0.01))
            names = {family.name for family in metrics.families(loop, {"app": "x"})}
            for family in metrics.families(loop):
                for labels, _ in family.samples:
                    assert labels["pid"] == str(os.getpid())
        finally:
            loop.close()
        timing = {"asyncio_relaxed_busy_seconds", "asyncio_relaxed_idle_seconds",
                  "asyncio_relaxed_lag_seconds"}
        if timed:
            assert timing <= names
        else:
            assert not timing & names
        assert {"asyncio_relaxed_iterations", "asyncio_relaxed_syscalls",
                "asyncio_relaxed_slow_callbacks"} <= names


def test_prometheus_text_scraped_from_a_real_server() -> None:
    """A server on the loop answers GET /metrics with prometheus_client's
    text; the parser reads back what the loop counted."""
    prometheus = pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    loop = asyncio_relaxed.new_event_loop(time_metrics=True)
    registry = prometheus.CollectorRegistry()
    registry.register(metrics.PrometheusCollector(loop, labels={"app": "test"}))

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        body = prometheus.generate_latest(registry)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: " + prometheus.CONTENT_TYPE_LATEST.encode()
                     + b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        await writer.drain()
        writer.close()

    async def scrape() -> str:
        await asyncio.sleep(0.01)  # a wait: a stretch ends, lag has a sample
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        response = await reader.read()
        writer.close()
        await writer.wait_closed()
        server.close()
        await server.wait_closed()
        head, _, body = response.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        return body.decode()

    try:
        text = run(loop, scrape())
    finally:
        loop.close()
    parsed = {family.name: family for family in text_string_to_metric_families(text)}
    iterations = parsed["asyncio_relaxed_iterations"]
    assert iterations.type == "counter"
    [sample] = iterations.samples
    assert sample.name == "asyncio_relaxed_iterations_total"
    assert sample.labels == {"pid": str(os.getpid()), "app": "test"} and sample.value > 0
    accepted = parsed["asyncio_relaxed_accepted_connections"]
    assert [s.value for s in accepted.samples if s.name.endswith("_total")] == [1.0]
    lag = parsed["asyncio_relaxed_lag_seconds"]
    assert lag.type == "histogram"
    count = [s for s in lag.samples if s.name == "asyncio_relaxed_lag_seconds_count"]
    assert count and count[0].value > 0
    calls = {s.labels["call"]: s.value for s in parsed["asyncio_relaxed_syscalls"].samples
             if s.name.endswith("_total")}
    assert calls["accept"] >= 1 and calls["poll"] >= 1
    assert parsed["asyncio_relaxed_busy_seconds"].samples[0].value > 0
    # Scraped while the client's connection and its server side were open.
    assert parsed["asyncio_relaxed_open_connections"].samples[0].value == 2
    assert parsed["asyncio_relaxed_open_tls_connections"].samples[0].value == 0
    assert parsed["asyncio_relaxed_listeners"].samples[0].value == 1
    assert parsed["asyncio_relaxed_write_buffer_bytes"].type == "gauge"
    [info] = parsed["asyncio_relaxed_info"].samples
    assert info.name == "asyncio_relaxed_info" and info.value == 1
    assert info.labels["version"] == asyncio_relaxed.__version__
    assert info.labels["backend"] == "epoll" and info.labels["time_metrics"] == "on"
    assert info.labels["accept"] == "batch" and info.labels["pid"] == str(os.getpid())


def test_opentelemetry_instruments_read_through_the_sdk() -> None:
    pytest.importorskip("opentelemetry.sdk.metrics")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    loop = asyncio_relaxed.new_event_loop(time_metrics=True)
    try:
        instruments = metrics.observe(loop, provider.get_meter("test"), {"app": "test"})
        loop.run_until_complete(asyncio.sleep(0.01))
        data = reader.get_metrics_data()
    finally:
        loop.close()
        provider.shutdown()
    assert instruments
    points: dict[str, list[Any]] = {}
    for resource_metrics in data.resource_metrics:
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                points[metric.name] = list(metric.data.data_points)
    [iterations] = points["asyncio_relaxed.iterations"]
    assert iterations.value > 0 and iterations.attributes["app"] == "test"
    assert points["asyncio_relaxed.idle_seconds"][0].value > 0
    assert "asyncio_relaxed.lag_seconds.p99" in points
    assert {p.attributes["call"] for p in points["asyncio_relaxed.syscalls"]} >= {"poll", "recv"}
    assert points["asyncio_relaxed.open_connections"][0].value == 0
    assert points["asyncio_relaxed.listeners"][0].value == 0
    [info] = points["asyncio_relaxed.info"]
    assert info.value == 1 and info.attributes["version"] == asyncio_relaxed.__version__
    assert info.attributes["write"] == "eager" and info.attributes["app"] == "test"
