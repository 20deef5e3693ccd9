"""A loop's counters and health as metrics, for Prometheus and OpenTelemetry.

Prometheus (``pip install prometheus-client``, or the ``prometheus`` extra)::

    from prometheus_client import REGISTRY, generate_latest
    REGISTRY.register(asyncio_relaxed.metrics.PrometheusCollector(loop))
    generate_latest(REGISTRY)        # the text a /metrics handler serves

OpenTelemetry (``pip install opentelemetry-api``, or the ``otel`` extra)::

    asyncio_relaxed.metrics.observe(loop)   # observable instruments on the global meter

A pre-forked pool in one scrape: each worker's loop publishes to its
``stats_dir`` (asyncio_relaxed/_publish.py), and any process reads them all::

    REGISTRY.register(asyncio_relaxed.metrics.PoolCollector("/run/myapp-loops"))

The same families either way, read from ``loop.statistics()``,
``loop.health()``, ``loop.gauges()`` and ``loop.listener_statistics()`` when
the exporter asks (reading them from the exporter's thread is safe: plain
integers, copied lists).  Names follow Prometheus' conventions: a ``asyncio_relaxed_`` prefix,
base units in the name (``_seconds``), ``_total`` on counters.  Every sample
carries the process id (``pid``), so pre-forked workers (the gunicorn worker
classes) export apart and each worker's share of accepted connections is
``asyncio_relaxed_accepted_connections_total / ignoring(pid)
group_left sum(asyncio_relaxed_accepted_connections_total)``.  Busy, idle
and lag need the loop's ``time_metrics`` setting; without it they are left
out.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from . import pool
from ._health import LAG_BOUNDS
from ._publish import document
from ._stats import COUNTERS, GAUGES

__all__ = ["Family", "PoolCollector", "PrometheusCollector", "families", "observe",
           "pool_families", "snapshot_families"]


@dataclasses.dataclass(frozen=True)
class Family:
    """One metric and its samples: (labels, value) pairs; a histogram's
    value is (cumulative bucket counts by upper bound, sum)."""

    name: str  # without the _total of a counter, with its unit
    kind: str  # "counter", "gauge", "histogram" or "info" (value: a dict of labels)
    documentation: str
    unit: str  # "seconds", "" (a count)
    samples: list[tuple[dict[str, str], Any]]


# Loop counters (see asyncio_relaxed.COUNTERS) exported with a "call" label.
_SYSCALLS = {"poll_waits": "poll", "epoll_ctl_add": "epoll_ctl_add",
             "epoll_ctl_mod": "epoll_ctl_mod", "epoll_ctl_del": "epoll_ctl_del",
             "recv": "recv", "send": "send", "sendmsg": "sendmsg", "accept": "accept",
             "datagram_recv": "datagram_recv", "datagram_send": "datagram_send",
             "pipe_read": "pipe_read", "pipe_write": "pipe_write"}
_WOULD_BLOCK = {"recv_eagain": "recv", "send_eagain": "send", "accept_eagain": "accept",
                "datagram_recv_eagain": "datagram_recv",
                "datagram_send_eagain": "datagram_send",
                "pipe_read_eagain": "pipe_read", "pipe_write_eagain": "pipe_write"}
# The rest, each a counter of its own.
_OWN = {"iterations": "iterations", "events": "io_events", "callbacks": "callbacks",
        "writes": "writes", "writes_deferred": "writes_deferred",
        "writes_coalesced": "writes_coalesced", "partial_writes": "partial_writes",
        "write_feeds": "write_feeds", "always_ready_fds": "always_ready_fds",
        "datagram_read_events": "datagram_read_events",
        "datagrams_received": "datagrams_received",
        "datagram_bytes_received": "datagram_received_bytes",
        "datagrams_sent": "datagrams_sent", "datagram_bytes_sent": "datagram_sent_bytes",
        "datagram_errors": "datagram_errors",
        "pipe_bytes_read": "pipe_read_bytes", "pipe_bytes_written": "pipe_written_bytes"}
assert set(_SYSCALLS) | set(_WOULD_BLOCK) | set(_OWN) == set(COUNTERS)

_PREFIX = "asyncio_relaxed_"


def families(loop: Any, labels: Mapping[str, str] | None = None) -> list[Family]:
    """Every family of *loop* now; each sample labelled with *labels* and
    the process id."""
    return snapshot_families(document(loop), {"pid": str(os.getpid()), **(labels or {})})


def snapshot_families(snapshot: Mapping[str, Any], base: Mapping[str, str]) -> list[Family]:
    """Every family of one loop's snapshot (``_publish.document``, or a file
    a pool's worker published), each sample labelled with *base*."""
    base = dict(base)
    stats = snapshot["statistics"]
    health = snapshot["health"]
    settings = snapshot["settings"]
    out = [Family(_PREFIX + "info", "info", "the loop: version, Python, backend, settings", "",
                  [(base, {"version": snapshot["version"], "python": snapshot["python"],
                           "backend": snapshot["backend"],
                           **{name: settings[name] for name in _INFO_SETTINGS}})])]
    # A counter this version has and the worker's does not (a file an older
    # worker published into the same directory) has no sample of it.
    out += [
        Family(_PREFIX + name, "counter", COUNTERS[counter], "",
               [(base, stats[counter])] if counter in stats else [])
        for counter, name in _OWN.items()
    ]
    out.append(Family(_PREFIX + "syscalls", "counter",
                      "system calls the loop made, by call",
                      "", [({**base, "call": call}, stats[counter])
                           for counter, call in _SYSCALLS.items() if counter in stats]))
    out.append(Family(_PREFIX + "syscalls_would_block", "counter",
                      "system calls that found nothing to do (EAGAIN), by call",
                      "", [({**base, "call": call}, stats[counter])
                           for counter, call in _WOULD_BLOCK.items() if counter in stats]))
    out.append(Family(_PREFIX + "slow_callbacks", "counter",
                      "callbacks that ran longer than the slow_callback setting",
                      "", [(base, health["slow_callbacks"])]))
    out += [Family(_PREFIX + name, "gauge", GAUGES[gauge], "", [(base, snapshot["gauges"][gauge])])
            for gauge, name in _GAUGES.items()]
    if health["time_metrics"]:
        out.append(Family(_PREFIX + "busy_seconds", "counter",
                          "time the loop spent between polls (callbacks, writes, timers)",
                          "seconds", [(base, health["busy_time"])]))
        out.append(Family(_PREFIX + "idle_seconds", "counter",
                          "time the loop spent blocked in the poll", "seconds",
                          [(base, health["idle_time"])]))
        cumulative, buckets = 0, []
        for bound, count in zip(LAG_BOUNDS, health["lag_buckets"], strict=True):
            cumulative += count
            buckets.append((bound, cumulative))
        out.append(Family(_PREFIX + "lag_seconds", "histogram",
                          "how late ready work and due timers ran", "seconds",
                          [(base, (buckets, health["lag_sum"]))]))
    listeners = snapshot["listeners"]
    for name, kind, doc, unit, field in _LISTENER_FAMILIES:
        samples = []
        for listener in listeners:
            value = listener[field]
            if value is not None:
                samples.append(({**base, "listener": listener["address"],
                                 "strategy": listener["strategy"]}, value))
        if samples:
            out.append(Family(_PREFIX + name, kind, doc, unit, samples))
    return out


_LISTENER_FAMILIES = (
    ("accepted_connections", "counter", "connections a listener accepted", "", "accepted"),
    ("accept_queue_length", "gauge",
     "connections waiting in a listener's accept queue when it last read it (Linux TCP)", "",
     "queue_length"),
    ("accept_queue_length_max", "gauge",
     "the longest accept queue a listener saw (Linux TCP)", "", "queue_length_max"),
    ("accept_rests", "counter", "accept=balanced rests out of the poller", "", "rests"),
    ("accept_rest_seconds", "counter", "scheduled time of accept=balanced rests", "seconds",
     "rest_seconds"),
)
# The settings the info metric carries as labels: those that change behaviour.
_INFO_SETTINGS = ("write", "partial_write", "accept", "exclusive_accept", "tls", "poller",
                  "time_metrics")
# Gauges (see asyncio_relaxed.GAUGES), each a family of its own.
_GAUGES = {"connections": "open_connections", "tls_connections": "open_tls_connections",
           "reading_paused": "reading_paused_connections",
           "writing_paused": "writing_paused_connections",
           "write_buffer_bytes": "write_buffer_bytes", "listeners": "listeners",
           "pending_accepts": "pending_accepts"}
assert set(_GAUGES) == set(GAUGES)

class PrometheusCollector:
    """A prometheus_client collector of one loop's :func:`families`;
    register it with ``REGISTRY.register(PrometheusCollector(loop))``."""

    def __init__(self, loop: Any, labels: Mapping[str, str] | None = None) -> None:
        self.loop = loop
        self.labels = dict(labels or {})

    def collect(self) -> Iterator[Any]:
        return _prometheus(families(self.loop, self.labels))

    def describe(self) -> list[Any]:
        return []  # families vary with the loop's settings and listeners


class PoolCollector:
    """A prometheus_client collector of every live worker of a pool: the
    snapshots in *directory* (the loops' ``stats_dir`` setting), read at
    each scrape, so any one worker, or a process beside them, serves the
    whole pool's ``/metrics``::

        REGISTRY.register(asyncio_relaxed.metrics.PoolCollector("/run/myapp-loops"))

    See :func:`pool_families` for what it exports."""

    def __init__(self, directory: str, labels: Mapping[str, str] | None = None) -> None:
        self.directory = directory
        self.labels = dict(labels or {})

    def collect(self) -> Iterator[Any]:
        return _prometheus(pool_families(pool.read(self.directory), self.labels))

    def describe(self) -> list[Any]:
        return []


def pool_families(workers: Sequence[pool.Worker],
                  labels: Mapping[str, str] | None = None) -> list[Family]:
    """Each worker's families labelled with its ``pid``, the age of its
    snapshot (``asyncio_relaxed_snapshot_age_seconds``), and the pool's sums
    where they add up, as ``asyncio_relaxed_pool_*`` without a pid: every
    counter, the lag histogram, the gauges but for the accept queue (which
    the workers share, so each sees all of it), and the number of live and
    stale workers.  A worker that exits takes its share out of the sums:
    rates over the pool are ``sum(rate(x[1m]))`` of the per-worker series."""
    extra = dict(labels or {})
    merged: dict[str, Family] = {}
    out: list[Family] = []
    for worker in workers:
        base = {"pid": str(worker.pid), **extra}
        for family in snapshot_families(worker.snapshot, base):
            known = merged.get(family.name)
            if known is None:
                merged[family.name] = family
                out.append(family)
            else:
                known.samples.extend(family.samples)
    out.append(Family(_PREFIX + "snapshot_age_seconds", "gauge",
                      "seconds since the worker's loop last published its snapshot", "seconds",
                      [({"pid": str(worker.pid), **extra}, worker.age) for worker in workers]))
    sums = [Family(_PREFIX + "pool_workers", "gauge",
                   "workers whose snapshot is in the directory", "", [(extra, len(workers))]),
            Family(_PREFIX + "pool_stale_workers", "gauge",
                   f"workers whose snapshot is older than {pool.STALE_AFTER:g} s (blocked or "
                   "stopped loops)", "", [(extra, sum(w.stale for w in workers))])]
    for family in out:
        if family.kind == "info" or family.name in _NOT_ADDITIVE:
            continue
        totals: dict[tuple[tuple[str, str], ...], Any] = {}
        for sample_labels, value in family.samples:
            key = tuple((k, v) for k, v in sample_labels.items() if k != "pid")
            totals[key] = value if key not in totals else _add(totals[key], value)
        sums.append(Family(_PREFIX + "pool_" + family.name[len(_PREFIX):], family.kind,
                           f"{family.documentation}, summed over the pool's workers",
                           family.unit, [(dict(key), value) for key, value in totals.items()]))
    return out + sums


# Per-worker families whose sum over the workers means nothing: the accept
# queue the workers share (each reads all of it) and the snapshots' ages.
_NOT_ADDITIVE = frozenset({_PREFIX + "accept_queue_length", _PREFIX + "accept_queue_length_max",
                           _PREFIX + "pending_accepts", _PREFIX + "snapshot_age_seconds"})


def _add(a: Any, b: Any) -> Any:
    if isinstance(a, tuple):  # a histogram: (cumulative buckets, sum)
        buckets = [(bound, x + y) for (bound, x), (_b, y) in zip(a[0], b[0], strict=True)]
        return (buckets, a[1] + b[1])
    return a + b


def _prometheus(families: list[Family]) -> Iterator[Any]:
    """prometheus_client metric families of ours."""
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        InfoMetricFamily,
    )

    for family in families:
        if not family.samples:
            continue
        names = list(family.samples[0][0])
        if family.kind == "histogram":
            metric: Any = HistogramMetricFamily(family.name, family.documentation,
                                                labels=names, unit=family.unit)
            for labels, (buckets, total) in family.samples:
                metric.add_metric([labels[n] for n in names],
                                  [(_le(bound), count) for bound, count in buckets], total)
        elif family.kind == "info":
            metric = InfoMetricFamily(family.name.removesuffix("_info"), family.documentation,
                                      labels=names)
            for labels, value in family.samples:
                metric.add_metric([labels[n] for n in names], value)
        else:
            kind = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
            metric = kind(family.name, family.documentation, labels=names, unit=family.unit)
            for labels, value in family.samples:
                metric.add_metric([labels[n] for n in names], value)
        yield metric


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


def observe(loop: Any, meter: Any = None, attributes: Mapping[str, str] | None = None) -> list[Any]:
    """OpenTelemetry observable instruments for *loop*'s families, on *meter*
    (default: ``opentelemetry.metrics.get_meter("asyncio_relaxed")``): a
    counter or gauge per family, and for the lag histogram (the API has no
    observable histogram) gauges of its 50th and 99th percentile and maximum.
    Returns the instruments."""
    from opentelemetry import metrics as otel

    if meter is None:
        meter = otel.get_meter("asyncio_relaxed")
    extra = dict(attributes or {})
    instruments = []
    for family in families(loop, extra):
        name = "asyncio_relaxed." + family.name[len(_PREFIX):]  # asyncio_relaxed.iterations
        unit = "s" if family.unit == "seconds" else "1"
        if family.kind == "info":
            instruments.append(meter.create_observable_gauge(
                name, callbacks=[_family_callback(loop, family.name, extra, otel)], unit="1",
                description=family.documentation))
            continue
        if family.kind == "histogram":
            for label, pick in (("p50", "lag_p50"), ("p99", "lag_p99"), ("max", "lag_max")):
                instruments.append(meter.create_observable_gauge(
                    f"{name}.{label}", callbacks=[_health_callback(loop, pick, extra, otel)],
                    unit=unit, description=f"{family.documentation} ({label})"))
            continue
        create = (meter.create_observable_counter if family.kind == "counter"
                  else meter.create_observable_gauge)
        callback = _family_callback(loop, family.name, extra, otel)
        instruments.append(create(name, callbacks=[callback], unit=unit,
                                  description=family.documentation))
    return instruments


def _family_callback(loop: Any, name: str, extra: dict[str, str], otel: Any) -> Any:
    def callback(options: Any) -> list[Any]:
        for family in families(loop, extra):
            if family.name == name:
                if family.kind == "info":  # 1, the facts as attributes
                    return [otel.Observation(1, {**labels, **value})
                            for labels, value in family.samples]
                return [otel.Observation(value, labels) for labels, value in family.samples]
        return []
    return callback


def _health_callback(loop: Any, pick: str, extra: dict[str, str], otel: Any) -> Any:
    def callback(options: Any) -> list[Any]:
        health = loop.health()
        return [otel.Observation(getattr(health, pick), {"pid": str(os.getpid()), **extra})]
    return callback
