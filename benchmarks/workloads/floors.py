"""The floors: echo servers without an event loop, what the loops are read against.

Each floor is the least a Python echo server executes for the workload, so
the CPU time per request of each loop reads against what Python, the
kernel and (over TLS) OpenSSL cost here, on this machine, in the same run:

- ``floor``: one epoll, accept until EAGAIN, ``recv_into`` one page-aligned
  buffer and ``send`` from it, no copy;
- ``floor-tls-bio``: the same around an ``ssl.SSLObject`` per connection
  with its two memory BIOs (what asyncio's sslproto and asyncio_relaxed's own TLS
  transport are built on): the ciphertext is received into one reused
  buffer and written to the incoming BIO, the plaintext read out with
  ``SSLObject.read(n, buffer)`` into a second reused buffer (no fresh
  ``bytes`` per read, the cost uvloop PR #726 measured), written back with
  ``SSLObject.write`` and the outgoing BIO's records sent in one ``send``;
- ``floor-tls-socket``: the same with a non-blocking ``ssl.SSLSocket``
  (OpenSSL reads and writes the socket itself): ``recv_into`` one reused
  buffer, ``send`` from it;
- ``floor-udp``: one UDP socket (:func:`udp_socket`, as every loop's UDP
  server gets it), ``recvfrom_into`` one page-aligned buffer until EAGAIN at
  each readiness event, ``sendto`` each datagram back to its sender from
  that buffer.

Each is a correct echo, not only a fast one (over UDP: a datagram whose
sendto finds the send buffer full is kept, in order, for EPOLLOUT, where a
loop's transport buffers it too): a short send keeps the rest and
waits for EPOLLOUT with input off (over TLS: the records not yet sent, or for
the SSLSocket the same plaintext again, as OpenSSL requires after
SSLWantWriteError); a peer's close_notify is answered with ours.  No
protocol, transport, handle, flow control or statistics.  The runner's marks
arrive through :class:`benchmarks.workloads.control.Wakeup`.
benchmarks.counts.driver has the same floors in instructions, driven
in-process.
"""

from __future__ import annotations

import collections
import mmap
import select
import socket
import ssl
from collections.abc import Callable
from typing import Any

from benchmarks.harness import tls
from benchmarks.workloads.control import Wakeup, listening

#: What each server asks for per read (stock's max_size).
READ_SIZE = 256 * 1024
_PRIVATE_ANONYMOUS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
#: A peer that went away: its connection only.
_GONE = (ConnectionError, ssl.SSLError, OSError)


#: SO_RCVBUF and SO_SNDBUF of a UDP server's socket (every loop's and the
#: floor's): 4 MiB, Linux's default net.core.rmem_max and wmem_max, so that
#: the burst workload's 320 datagrams in flight (10 clients x 32 x 1 KiB,
#: each about 2.3 KiB of the buffer's accounting) are never dropped; the
#: default 208 KiB drops some.
UDP_BUFFER = 4 * 1024 * 1024


def udp_socket() -> socket.socket:
    """A non-blocking UDP socket bound to 127.0.0.1, an ephemeral port, with
    :data:`UDP_BUFFER` each way (the kernel caps it at its rmem_max/wmem_max)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            sock.setsockopt(socket.SOL_SOCKET, option, UDP_BUFFER)
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def aligned_buffer(size: int = READ_SIZE) -> memoryview:
    """A page-aligned buffer (an anonymous mmap), not bytearray(256 KiB),
    which glibc places 16 bytes past a page boundary: on the machine of the
    README the kernel's copy into such a buffer costs about twice the system
    time of an aligned one, and every figure would measure that."""
    return memoryview(mmap.mmap(-1, size, flags=_PRIVATE_ANONYMOUS))


class _Floor:
    """One epoll over a listener, the runner's wake-up and the connections;
    the kinds differ in what a connection does when it is readable or
    writable (:meth:`accepted`, :meth:`readable`, :meth:`writable`)."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1024)
        self.listener.setblocking(False)
        self.epoll = select.epoll()
        self.conns: dict[int, socket.socket] = {}

    def serve(self, name: str) -> None:
        wake = Wakeup()
        self.epoll.register(self.listener.fileno(), select.EPOLLIN)
        self.epoll.register(wake.fileno(), select.EPOLLIN)
        listening(self.listener.getsockname()[1], name, None)
        lfd, wfd = self.listener.fileno(), wake.fileno()
        while wake.running:
            for fd, mask in self.epoll.poll(-1, 1024):
                if fd in self.conns:
                    try:
                        if mask & select.EPOLLOUT:
                            self.writable(fd)
                        else:
                            self.readable(fd)
                    except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
                        pass
                    except _GONE:
                        self.close(fd)
                elif fd == lfd:
                    self._accept()
                elif fd == wfd:
                    wake.ready()
        for fd in list(self.conns):
            self.close(fd)
        self.listener.close()
        self.epoll.close()
        wake.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = self.accepted(conn)
            self.conns[conn.fileno()] = conn
            self.epoll.register(conn.fileno(), select.EPOLLIN)

    def accepted(self, conn: socket.socket) -> socket.socket:
        return conn

    def readable(self, fd: int) -> None:
        raise NotImplementedError

    def writable(self, fd: int) -> None:
        raise NotImplementedError

    def wait_writable(self, fd: int) -> None:
        self.epoll.modify(fd, select.EPOLLOUT)

    def wait_readable(self, fd: int) -> None:
        self.epoll.modify(fd, select.EPOLLIN)

    def close(self, fd: int) -> None:
        self.epoll.unregister(fd)
        self.conns.pop(fd).close()


class _BytesFloor(_Floor):
    """A floor whose short send keeps the bytes not sent (plaintext, or
    records) and sends them when the socket is writable, input off."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: dict[int, bytes] = {}

    def send(self, fd: int, sock: socket.socket, data: memoryview | bytes) -> None:
        try:
            sent = sock.send(data)
        except (BlockingIOError, InterruptedError):  # the send buffer is full
            sent = 0
        if sent < len(data):
            self.pending[fd] = bytes(data[sent:])
            self.wait_writable(fd)

    def writable(self, fd: int) -> None:
        rest = self.pending[fd]  # kept until sent: a send that raises loses nothing
        sent = self.conns[fd].send(rest)
        if sent < len(rest):
            self.pending[fd] = rest[sent:]
        else:
            del self.pending[fd]
            self.wait_readable(fd)

    def close(self, fd: int) -> None:
        super().close(fd)
        self.pending.pop(fd, None)


class PlainFloor(_BytesFloor):
    """``floor``: recv_into one buffer, send from it."""

    def __init__(self) -> None:
        super().__init__()
        self.view = aligned_buffer()

    def readable(self, fd: int) -> None:
        sock = self.conns[fd]
        n = sock.recv_into(self.view)
        if not n:
            self.close(fd)
            return
        self.send(fd, sock, self.view[:n])


class BioFloor(_BytesFloor):
    """``floor-tls-bio``: an SSLObject and two memory BIOs per connection."""

    def __init__(self) -> None:
        super().__init__()
        self.context = tls.server_context()
        self.cipher = aligned_buffer()  # ciphertext in
        self.plain = aligned_buffer()  # plaintext out of the SSLObject
        self.tls: dict[int, tuple[ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO]] = {}

    def accepted(self, conn: socket.socket) -> socket.socket:
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        obj = self.context.wrap_bio(incoming, outgoing, server_side=True)
        self.tls[conn.fileno()] = (obj, incoming, outgoing)
        return conn

    def readable(self, fd: int) -> None:
        sock = self.conns[fd]
        obj, incoming, outgoing = self.tls[fd]
        n = sock.recv_into(self.cipher)
        if not n:
            self.close(fd)
            return
        incoming.write(self.cipher[:n])
        try:
            # 0: the peer's close_notify (CPython returns no data for it
            # rather than raising SSLZeroReturnError): answer with ours.
            # The reads stop when neither the BIO nor OpenSSL holds more:
            # the read that would raise SSLWantReadError costs more than
            # the rest of the echo.
            while m := obj.read(READ_SIZE, self.plain):
                obj.write(self.plain[:m])
                if not incoming.pending and not obj.pending():
                    break
        except ssl.SSLWantReadError:
            m = 1  # everything received is read (or the handshake wants more)
        if m:
            self.flush(fd, sock, outgoing)
            return
        try:
            obj.unwrap()
        except ssl.SSLError:
            pass
        self.flush(fd, sock, outgoing)
        self.close(fd)

    def flush(self, fd: int, sock: socket.socket, outgoing: ssl.MemoryBIO) -> None:
        if outgoing.pending:
            self.send(fd, sock, outgoing.read())

    def close(self, fd: int) -> None:
        super().close(fd)
        self.tls.pop(fd, None)


class SocketFloor(_Floor):
    """``floor-tls-socket``: a non-blocking SSLSocket per connection."""

    def __init__(self) -> None:
        super().__init__()
        self.context = tls.server_context()
        self.view = aligned_buffer()
        self.handshaking: set[int] = set()
        self.pending: dict[int, bytes] = {}  # plaintext to write again

    def accepted(self, conn: socket.socket) -> socket.socket:
        wrapped = self.context.wrap_socket(conn, server_side=True,
                                           do_handshake_on_connect=False)
        self.handshaking.add(wrapped.fileno())
        return wrapped

    def _handshake(self, fd: int, sock: ssl.SSLSocket) -> bool:
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            return False
        except ssl.SSLWantWriteError:
            self.wait_writable(fd)
            return False
        self.handshaking.discard(fd)
        return True

    def readable(self, fd: int) -> None:
        sock = self.conns[fd]
        assert isinstance(sock, ssl.SSLSocket)
        if fd in self.handshaking and not self._handshake(fd, sock):
            return
        try:
            while True:  # until SSLWantReadError: OpenSSL may hold more records
                n = sock.recv_into(self.view)
                if not n:  # the peer's close_notify (or EOF): answer with ours
                    try:
                        sock.unwrap()
                    except (ssl.SSLError, OSError):
                        pass
                    self.close(fd)
                    return
                if not self.send(fd, sock, self.view[:n]):
                    return
        except ssl.SSLWantReadError:
            pass

    def send(self, fd: int, sock: ssl.SSLSocket, data: memoryview | bytes) -> bool:
        """Send *data*; False when some waits for EPOLLOUT."""
        try:
            sent = sock.send(data)
        except ssl.SSLWantWriteError:
            sent = 0
        if sent < len(data):
            self.pending[fd] = bytes(data[sent:])
            self.wait_writable(fd)
            return False
        return True

    def writable(self, fd: int) -> None:
        sock = self.conns[fd]
        assert isinstance(sock, ssl.SSLSocket)
        if fd in self.handshaking:
            self.wait_readable(fd)
            self._handshake(fd, sock)
            return
        rest = self.pending.pop(fd)
        self.wait_readable(fd)
        self.send(fd, sock, rest)

    def close(self, fd: int) -> None:
        super().close(fd)
        self.handshaking.discard(fd)
        self.pending.pop(fd, None)


class UdpFloor:
    """``floor-udp``: one epoll over one UDP socket and the runner's wake-up."""

    def __init__(self) -> None:
        self.sock = udp_socket()
        self.epoll = select.epoll()
        self.view = aligned_buffer()
        #: Datagrams whose sendto found the send buffer full, in order.
        self.pending: collections.deque[tuple[bytes, Any]] = collections.deque()

    def serve(self, name: str) -> None:
        wake = Wakeup()
        fd, wfd = self.sock.fileno(), wake.fileno()
        self.epoll.register(fd, select.EPOLLIN)
        self.epoll.register(wfd, select.EPOLLIN)
        listening(self.sock.getsockname()[1], name, None)
        while wake.running:
            for ready, mask in self.epoll.poll(-1, 1024):
                if ready == fd:
                    if mask & select.EPOLLOUT:
                        self.writable()
                    if mask & select.EPOLLIN:
                        self.readable()
                elif ready == wfd:
                    wake.ready()
        self.epoll.close()
        self.sock.close()
        wake.close()

    def readable(self) -> None:
        """Every datagram the socket holds, each sent back at once (or kept
        behind those already kept)."""
        recvfrom_into, sendto, view = self.sock.recvfrom_into, self.sock.sendto, self.view
        while True:
            try:
                n, addr = recvfrom_into(view)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # an ICMP error of an earlier send: nothing to echo
                continue
            if self.pending:
                self.pending.append((bytes(view[:n]), addr))
                continue
            try:
                sendto(view[:n], addr)
            except (BlockingIOError, InterruptedError):
                self.pending.append((bytes(view[:n]), addr))
                self.epoll.modify(self.sock.fileno(), select.EPOLLIN | select.EPOLLOUT)
            except OSError:
                pass  # a datagram the kernel refuses is lost, as UDP allows

    def writable(self) -> None:
        while self.pending:
            data, addr = self.pending[0]
            try:
                self.sock.sendto(data, addr)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                pass
            self.pending.popleft()
        self.epoll.modify(self.sock.fileno(), select.EPOLLIN)


#: Floor name -> its server.
FLOORS: dict[str, Callable[[], _Floor | UdpFloor]] = {
    "floor": PlainFloor,
    "floor-tls-bio": BioFloor,
    "floor-tls-socket": SocketFloor,
    "floor-udp": UdpFloor,
}


def serve(name: str) -> None:
    """Serve floor *name* until the runner's input ends."""
    FLOORS[name]().serve(name)
