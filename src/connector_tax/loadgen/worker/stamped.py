"""The kernel-stamped transport: plain TCP read with recvmsg, each read timed by SO_TIMESTAMPNS.

A user-space stamp is as late as the worker is to its socket; the kernel's is the moment the
read's last segment reached this host's TCP stack, moved to CLOCK_MONOTONIC. The HTTP client
(http.py) reads through it on plain TCP; TLS connections use uvloop's SSL transport instead.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import sys
import threading
import time
from typing import Protocol, TypeVar

# SO_TIMESTAMPNS (Linux; Python's socket module does not name it; 35 in asm-generic, x86 and arm):
# every read returns, as ancillary data, the CLOCK_REALTIME time at which the last segment it
# holds was received. Elsewhere StampedTransport stamps the read itself.
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform == "linux" else None)
_TIMESPEC = struct.Struct("qq")
_monotonic_ns = time.monotonic_ns
_time_ns = time.time_ns
READ_SIZE = 256 * 1024


class StampedProtocol(Protocol):
    """What StampedTransport hands its reads to: asyncio.Protocol's calls, each read with its time."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None: ...

    def stamped_data_received(self, t_ns: int, data: bytes) -> None: ...

    def connection_lost(self, exc: Exception | None) -> None: ...


_P = TypeVar("_P", bound=StampedProtocol)


_buffers = threading.local()


def _read_buffer() -> tuple[list[bytearray], memoryview]:
    """This thread's READ_SIZE buffer, which its transports read into and copy out of. recvmsg(n)
    allocates n bytes per call and shrinks them; at 256 KiB glibc can map and unmap them every
    time (page faults, TLB flushes): 22 µs a read in a loop over 32 sockets here against 5.6 µs
    into a buffer. (In the worker glibc's mapping threshold had adapted and the two cost the same.)"""
    held = getattr(_buffers, "held", None)
    if held is None:
        buf = bytearray(READ_SIZE)
        held = _buffers.held = ([buf], memoryview(buf))
    return held


def realtime_offset() -> int:
    """CLOCK_REALTIME minus CLOCK_MONOTONIC, now, in ns: the wall clock read between two monotonic
    reads, against their midpoint (reading one clock before the other biased every stamp by the
    gap, ~150 ns early, which put a first token before the server's own stamp of its write); a
    bracket an interruption stretched past 2 µs is read again, once."""
    m1 = _monotonic_ns()
    r = _time_ns()
    m2 = _monotonic_ns()
    if m2 - m1 > 2_000:
        m1 = _monotonic_ns()
        r = _time_ns()
        m2 = _monotonic_ns()
    return r - ((m1 + m2) >> 1)


# The offset as last read, and when: reads within OFFSET_TTL_NS of it use it again. A slewing
# wall clock moves it at most 500 ppm (adjtimex's bound), 1 µs in 2 ms; a stepped one is caught
# by never letting a stamp be later than its read. Reading it per read was three clock reads and
# a call on every token's path.
OFFSET_TTL_NS = 2_000_000
_offset = [0, -OFFSET_TTL_NS - 1]


class StampedTransport(asyncio.Transport):
    """A plain-TCP transport that reads with recvmsg and hands each read to its protocol with
    the kernel's receive time of the read's last segment (SO_TIMESTAMPNS), as CLOCK_MONOTONIC.

    The stamp is CLOCK_REALTIME; it is moved to CLOCK_MONOTONIC by the two clocks' offset read
    within OFFSET_TTL_NS of the read (a slewing wall clock costs ≤ 1 µs; a stepped one could put
    a stamp after the read itself, and a stamp is never allowed later than the moment the read ran).
    Several segments in one read (the worker was late, or the server wrote faster than the
    worker read) all take the last one's stamp, as a user-space stamp would give them all the
    read's time. Writes go straight to the socket; what it does not take waits for writability.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, protocol: StampedProtocol) -> None:
        super().__init__()
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._protocol = protocol
        self._pending: list[bytes] = []  # written while the socket was full
        self._closing = False
        self._buf, self._view = _read_buffer()
        if SO_TIMESTAMPNS is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            except OSError:
                pass  # no stamp comes with the reads: _on_readable stamps them itself
        protocol.connection_made(self)
        loop.add_reader(self._fd, self._on_readable)

    @classmethod
    async def connect(cls, loop: asyncio.AbstractEventLoop, family: int, addr: str, port: int, protocol: _P) -> _P:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await loop.sock_connect(sock, (addr, port))
        except BaseException:
            sock.close()
            raise
        cls(loop, sock, protocol)
        return protocol

    def _on_readable(self) -> None:
        try:
            size, ancillary, _, _ = self._sock.recvmsg_into(self._buf, 64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lose(exc)
            return
        if not size:
            self._lose(None)  # the server closed it
            return
        data = bytes(self._view[:size])
        now = _monotonic_ns()
        if ancillary and ancillary[0][1] == SO_TIMESTAMPNS:  # SCM_TIMESTAMPNS == SO_TIMESTAMPNS
            sec, nsec = _TIMESPEC.unpack_from(ancillary[0][2])
            offset, read_at = _offset
            if now - read_at > OFFSET_TTL_NS:
                offset = realtime_offset()
                _offset[:] = offset, now
            stamp = sec * 1_000_000_000 + nsec - offset
            if stamp < now:
                now = stamp
        self._protocol.stamped_data_received(now, data)

    # -- asyncio.Transport ------------------------------------------------------------------
    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not isinstance(data, bytes):  # as asyncio's transports: the caller may reuse its buffer
            data = bytes(data)
        if self._closing:
            return
        if self._pending:
            self._pending.append(data)
            return
        try:
            sent = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._loop.call_soon(self._lose, exc)  # as asyncio's transports: never inside write()
            return
        if sent < len(data):
            self._pending.append(data[sent:])
            self._loop.add_writer(self._fd, self._on_writable)

    def _on_writable(self) -> None:
        data = b"".join(self._pending)
        try:
            sent = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lose(exc)
            return
        self._pending = [data[sent:]] if sent < len(data) else []
        if not self._pending:
            self._loop.remove_writer(self._fd)

    def abort(self) -> None:
        self._lose(None)

    def close(self) -> None:
        self._lose(None)

    def is_closing(self) -> bool:
        return self._closing

    def get_extra_info(self, name: str, default: object = None) -> object:
        return self._sock if name == "socket" else default

    def _lose(self, exc: Exception | None) -> None:
        if self._closing:
            return
        self._closing = True
        self._loop.remove_reader(self._fd)
        if self._pending:
            self._loop.remove_writer(self._fd)
            self._pending = []
        self._sock.close()
        self._loop.call_soon(self._protocol.connection_lost, exc)
