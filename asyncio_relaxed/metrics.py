"""A loop's counters and health as metrics, for Prometheus and OpenTelemetry.

Prometheus (``pip install 'asyncio-relaxed[prometheus]'``)::

    from prometheus_client import REGISTRY, generate_latest
    REGISTRY.register(asyncio_relaxed.metrics.PrometheusCollector(loop))
    generate_latest(REGISTRY)        # the text a /metrics handler serves

OpenTelemetry (``pip install 'asyncio-relaxed[otel]'``)::

    asyncio_relaxed.metrics.observe(loop)   # observable instruments on the global meter

The same families either way, read from ``loop.statistics()``,
``loop.health()`` and ``loop.listener_statistics()`` when the exporter asks
(reading them from the exporter's thread is safe: plain integers, a copied
list).  Names follow Prometheus' conventions: a ``asyncio_relaxed_`` prefix,
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
from collections.abc import Iterator, Mapping
from typing import Any

from ._health import LAG_BOUNDS
from ._stats import COUNTERS

__all__ = ["Family", "PrometheusCollector", "families", "observe"]


@dataclasses.dataclass(frozen=True)
class Family:
    """One metric and its samples: (labels, value) pairs; a histogram's
    value is (cumulative bucket counts by upper bound, sum)."""

    name: str  # without the _total of a counter, with its unit
    kind: str  # "counter", "gauge" or "histogram"
    documentation: str
    unit: str  # "seconds", "" (a count)
    samples: list[tuple[dict[str, str], Any]]


# Loop counters (see asyncio_relaxed.COUNTERS) exported with a "call" label.
_SYSCALLS = {"poll_waits": "poll", "epoll_ctl_add": "epoll_ctl_add",
             "epoll_ctl_mod": "epoll_ctl_mod", "epoll_ctl_del": "epoll_ctl_del",
             "recv": "recv", "send": "send", "sendmsg": "sendmsg", "accept": "accept"}
_WOULD_BLOCK = {"recv_eagain": "recv", "send_eagain": "send", "accept_eagain": "accept"}
# The rest, each a counter of its own.
_OWN = {"iterations": "iterations", "events": "io_events", "callbacks": "callbacks",
        "writes": "writes", "writes_deferred": "writes_deferred",
        "writes_coalesced": "writes_coalesced", "partial_writes": "partial_writes",
        "write_feeds": "write_feeds", "always_ready_fds": "always_ready_fds"}
assert set(_SYSCALLS) | set(_WOULD_BLOCK) | set(_OWN) == set(COUNTERS)

_PREFIX = "asyncio_relaxed_"


def families(loop: Any, labels: Mapping[str, str] | None = None) -> list[Family]:
    """Every family of *loop* now; each sample labelled with *labels* and
    the process id."""
    base = {"pid": str(os.getpid()), **(labels or {})}
    stats = loop.statistics()
    health = loop.health()
    out = [
        Family(_PREFIX + name, "counter", COUNTERS[counter], "", [(base, getattr(stats, counter))])
        for counter, name in _OWN.items()
    ]
    out.append(Family(_PREFIX + "syscalls", "counter",
                      "system calls the loop made, by call",
                      "", [({**base, "call": call}, getattr(stats, counter))
                           for counter, call in _SYSCALLS.items()]))
    out.append(Family(_PREFIX + "syscalls_would_block", "counter",
                      "system calls that found nothing to do (EAGAIN), by call",
                      "", [({**base, "call": call}, getattr(stats, counter))
                           for counter, call in _WOULD_BLOCK.items()]))
    out.append(Family(_PREFIX + "slow_callbacks", "counter",
                      "callbacks that ran longer than the slow_callback setting",
                      "", [(base, health.slow_callbacks)]))
    if health.time_metrics:
        out.append(Family(_PREFIX + "busy_seconds", "counter",
                          "time the loop spent between polls (callbacks, writes, timers)",
                          "seconds", [(base, health.busy_time)]))
        out.append(Family(_PREFIX + "idle_seconds", "counter",
                          "time the loop spent blocked in the poll", "seconds",
                          [(base, health.idle_time)]))
        cumulative, buckets = 0, []
        for bound, count in zip(LAG_BOUNDS, health.lag_buckets, strict=True):
            cumulative += count
            buckets.append((bound, cumulative))
        out.append(Family(_PREFIX + "lag_seconds", "histogram",
                          "how late ready work and due timers ran", "seconds",
                          [(base, (buckets, health.lag_sum))]))
    listeners = loop.listener_statistics()
    for name, kind, doc, unit, field in _LISTENER_FAMILIES:
        samples = []
        for listener in listeners:
            value = getattr(listener, field)
            if value is not None:
                samples.append(({**base, "listener": _address(listener.address),
                                 "strategy": listener.strategy}, value))
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


def _address(address: Any) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = address[0], address[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(address)


class PrometheusCollector:
    """A prometheus_client collector of one loop's :func:`families`;
    register it with ``REGISTRY.register(PrometheusCollector(loop))``."""

    def __init__(self, loop: Any, labels: Mapping[str, str] | None = None) -> None:
        self.loop = loop
        self.labels = dict(labels or {})

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        for family in families(self.loop, self.labels):
            names = list(family.samples[0][0])
            if family.kind == "histogram":
                metric: Any = HistogramMetricFamily(family.name, family.documentation,
                                                    labels=names, unit=family.unit)
                for labels, (buckets, total) in family.samples:
                    metric.add_metric([labels[n] for n in names],
                                      [(_le(bound), count) for bound, count in buckets], total)
            else:
                kind = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
                metric = kind(family.name, family.documentation, labels=names, unit=family.unit)
                for labels, value in family.samples:
                    metric.add_metric([labels[n] for n in names], value)
            yield metric

    def describe(self) -> list[Any]:
        return []  # families vary with the loop's settings and listeners


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
                return [otel.Observation(value, labels) for labels, value in family.samples]
        return []
    return callback


def _health_callback(loop: Any, pick: str, extra: dict[str, str], otel: Any) -> Any:
    def callback(options: Any) -> list[Any]:
        health = loop.health()
        return [otel.Observation(getattr(health, pick), {"pid": str(os.getpid()), **extra})]
    return callback
