"""Socket helpers of the transports and the accept path: what kind of
socket, its options, the vector limit, and the loop's receive buffer.

This module knows nothing of asyncio.
"""

from __future__ import annotations

import _socket
import mmap
import os
import socket
import sys

__all__ = ["ACCEPTED_INHERIT_TCP_OPTIONS", "C_CLOSE", "C_INIT", "C_NEW", "HAS_SENDMSG", "IOV_MAX",
           "SMALL_READ", "accepted_sockname", "is_tcp", "read_buffer", "set_options"]

try:
    IOV_MAX: int = max(16, os.sysconf("SC_IOV_MAX"))
except (AttributeError, ValueError, OSError):
    IOV_MAX = 16

HAS_SENDMSG = hasattr(socket.socket, "sendmsg")

#: The size of a small read (_transport, "Reads"): under glibc's default
#: M_MMAP_THRESHOLD (128 KiB), so recv() allocates from the heap.
SMALL_READ = 64 * 1024

# Linux copies TCP_NODELAY (and the keepalive options) from a listening socket
# to the sockets accept() returns; checked with getsockopt in the tests.
ACCEPTED_INHERIT_TCP_OPTIONS = sys.platform.startswith("linux")

# socket.socket's constructor and close() are Python frames around the C
# socket's; the accept path and a transport's end run their bodies with
# these instead (the same code from 3.11 to 3.15 and on PyPy: creating is
# C_NEW, C_INIT, then _io_refs = 0 and _closed = False; closing sets
# _closed and calls C_CLOSE unless makefile() holds a reference).
# tests/test_transport.py holds socket.socket's code to that.
C_NEW = _socket.socket.__new__
C_INIT = _socket.socket.__init__
C_CLOSE = _socket.socket.close

_TCP_FAMILIES = (socket.AF_INET, socket.AF_INET6)
_LINUX = sys.platform.startswith("linux")
_V4_MAPPED = bytes(10) + b"\xff\xff"
# Linux's IP_TRANSPARENT and IPV6_TRANSPARENT (not every Python names them).
_TRANSPARENT = {socket.AF_INET: (socket.IPPROTO_IP, getattr(socket, "IP_TRANSPARENT", 19)),
                socket.AF_INET6: (socket.IPPROTO_IPV6, getattr(socket, "IPV6_TRANSPARENT", 75))}
# The C socket's own attributes: socket.socket's family and type properties
# make an enum member per read.
_FAMILY = _socket.socket.family
_TYPE = _socket.socket.type


def is_tcp(sock: socket.socket) -> bool:
    """A TCP stream socket, whatever its proto says (``socket.socket(family)``
    leaves it 0)."""
    if isinstance(sock, _socket.socket):
        family, kind = _FAMILY.__get__(sock), _TYPE.__get__(sock)
    else:  # a wrapper (gunicorn's listeners) that passes attributes on, or not a socket
        family, kind = getattr(sock, "family", None), getattr(sock, "type", None)
    return (family in _TCP_FAMILIES and kind == socket.SOCK_STREAM
            and getattr(sock, "proto", None) in (0, socket.IPPROTO_TCP))


def accepted_sockname(sock: socket.socket) -> object:
    """The local address of every socket accepted from the listening *sock*,
    where Linux gives them all the listener's own, else None (each is asked).

    A Unix stream socket accepted from a listener has the listener's bound
    address.  A TCP connection's local address is the one its SYN was sent
    to, which is the listener's when the listener is bound to one address
    and does not take connections for others (IP_TRANSPARENT, tproxy); a
    wildcard, an IPv4-mapped address (``::ffff:0.0.0.0`` is a wildcard) or a
    link-local one (whose scope is the arriving interface's) is asked per
    connection.
    """
    if not _LINUX or not isinstance(sock, _socket.socket):
        return None
    try:
        family = _FAMILY.__get__(sock)
        if _TYPE.__get__(sock) != socket.SOCK_STREAM:
            return None
        name = sock.getsockname()
        if family == socket.AF_UNIX:
            return name if name else None
        if family not in _TCP_FAMILIES:
            return None
        level, option = _TRANSPARENT[family]
        if sock.getsockopt(level, option):
            return None
        packed = socket.inet_pton(family, name[0])
    except OSError:
        return None
    if not packed.strip(b"\0"):  # 0.0.0.0 or ::
        return None
    if family == socket.AF_INET6 and (
            name[3]  # a scope: link-local
            or (packed[0] == 0xFE and packed[1] & 0xC0 == 0x80)  # fe80::/10
            or packed[:12] == _V4_MAPPED):  # ::ffff:a.b.c.d, ::ffff:0.0.0.0 a wildcard
        return None
    return name


def set_options(sock: socket.socket, options: list[tuple[int, int, int]]) -> None:
    """setsockopt each (level, option, value); a refused one is skipped."""
    for level, option, value in options:
        try:
            sock.setsockopt(level, option, value)
        except OSError:
            pass


def read_buffer(size: int) -> mmap.mmap | bytearray:
    """The loop's receive buffer: *size* bytes starting on a page boundary.

    Why aligned: the kernel's copy of received data into the buffer
    (``_copy_to_iter`` in a perf profile) is much dearer when the buffer
    starts a few bytes past a page boundary and the data came from the
    peer in page-sized chunks, as bulk data does.  A ``bytearray(256 KiB)``
    starts exactly there: glibc serves it with mmap and returns the page
    start + 16 (its chunk header); or, once freeing a large block has raised
    glibc's mmap threshold, a heap address whose offset depends on what the
    process allocated before.  echo-protocol-100k-c10 with the buffer placed
    at a chosen offset: 58-78 us system CPU per request at page offset 16,
    26-33 at offset 0 or 2048, with the same system calls in every case.

    An anonymous mmap is page-aligned whatever the heap's history.
    MAP_PRIVATE because mmap's default, MAP_SHARED, would let a process
    forked after this and its parent overwrite each other's reads.  Where
    there is no anonymous mmap (Windows), a bytearray.
    """
    if hasattr(mmap, "MAP_ANONYMOUS"):
        return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return bytearray(size)
