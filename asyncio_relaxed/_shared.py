"""What a loop hands its transports: one object per loop.

:class:`TransportShared` is the loop's write queue (:class:`~asyncio_relaxed._writes.WriteQueue`,
whose transitions the transports call) and holds the rest of what a
transport reads of its loop beyond stock's transport API: the settings and
counters, the poller (ownership of fds, the current key of an fd), the one
receive buffer of its plain-Protocol transports and the TCP options of its
connections.  A transport keeps one reference to it; a per-connection slot
for each of these would cost 8 bytes each per connection.

This module knows nothing of asyncio.
"""

from __future__ import annotations

import socket
from typing import Any

from ._config import Config, PartialWrite, WriteMode
from ._sockets import SMALL_READ, read_buffer
from ._stats import Counters
from ._writes import WriteQueue

__all__ = ["TransportShared"]


class TransportShared(WriteQueue):
    """A loop's write queue, settings, counters, poller, receive buffer and
    TCP options, as its transports see them."""

    __slots__ = ("config", "poller", "read_buffer", "read_size", "read_view", "small_read",
                 "tcp_sockopts")

    def __init__(self, config: Config, stats: Counters, poller: Any) -> None:
        super().__init__(
            stats,
            deferred=config.write is WriteMode.DEFERRED,
            feed=config.partial_write is PartialWrite.FEED,
            feed_limit=config.feed_limit,
        )
        self.config = config
        self.poller = poller
        self.read_size = config.read_size
        self.read_buffer = read_buffer(config.read_size)
        self.read_view = memoryview(self.read_buffer)
        #: A plain-Protocol transport's recv() size while reads are small
        #: (see _transport): SMALL_READ, or read_size if that is smaller.
        self.small_read = min(SMALL_READ, config.read_size)
        # (level, option, value) for every TCP connection: the keepalive knobs.
        self.tcp_sockopts: list[tuple[int, int, int]] = [
            (getattr(socket, level), getattr(socket, option), value)
            for level, option, value in config.tcp_options()
            if hasattr(socket, option)
        ]
