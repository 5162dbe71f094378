"""The worker's reads are timed by the kernel (stamped.StampedTransport, SO_TIMESTAMPNS): a read's
time is when its bytes reached this host's TCP stack, not when the worker got to them."""

from __future__ import annotations

import asyncio
import socket
import sys
import time

import pytest

from connector_tax.loadgen.worker import stamped
from connector_tax.loadgen.worker.http import ConnectionPool, HttpConnection
from connector_tax.loadgen.worker.stamped import StampedTransport, realtime_offset

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="SO_TIMESTAMPNS is Linux's")


class Recorder:
    """A protocol that keeps what StampedTransport hands it."""

    def __init__(self) -> None:
        self.reads: list[tuple[int, bytes]] = []
        self.lost: list[Exception | None] = []
        self.transport: StampedTransport | None = None

    def connection_made(self, transport: StampedTransport) -> None:
        self.transport = transport

    def stamped_data_received(self, t_ns: int, data: bytes) -> None:
        self.reads.append((t_ns, data))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.append(exc)


def _pair() -> tuple[socket.socket, socket.socket]:
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.socket()
    client.setblocking(False)
    try:
        client.connect(listener.getsockname())
    except BlockingIOError:
        pass
    server, _ = listener.accept()
    listener.close()
    return client, server


def _late_read(payload: bytes, busy_s: float) -> tuple[int, int, int, list[tuple[int, bytes]]]:
    """The server sends `payload`; the loop is busy for `busy_s` before it can read. Returns the
    monotonic times around the send, the time the read could start, and the reads."""

    async def main() -> tuple[int, int, int, list[tuple[int, bytes]]]:
        loop = asyncio.get_running_loop()
        client, server = _pair()
        rec = Recorder()
        StampedTransport(loop, client, rec)  # type: ignore[arg-type]
        before = time.monotonic_ns()
        server.send(payload)
        after = time.monotonic_ns()
        time.sleep(busy_s)  # the worker is busy: the loop gets to the socket this late
        read_from = time.monotonic_ns()
        for _ in range(100):
            await asyncio.sleep(0.001)
            if rec.reads:
                break
        server.close()
        rec.transport.close()  # type: ignore[union-attr]
        return before, after, read_from, rec.reads

    return asyncio.run(main())


def test_a_late_read_keeps_the_time_its_bytes_arrived() -> None:
    before, after, read_from, reads = _late_read(b"first token", 0.05)
    assert [data for _, data in reads] == [b"first token"]
    t = reads[0][0]
    # Stamped inside the server's send(), to within the two clocks' offset read (sub-µs), not
    # 50 ms later when the read ran.
    assert before - 2_000 <= t <= after + 2_000, (t - before, after - before)
    assert t < read_from


def test_without_a_kernel_stamp_the_read_is_stamped_when_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stamped, "SO_TIMESTAMPNS", None)
    _, _, read_from, reads = _late_read(b"x", 0.02)
    assert reads and reads[0][0] >= read_from


def test_a_write_the_socket_cannot_take_at_once_is_sent_whole_in_order() -> None:
    async def main() -> bytes:
        loop = asyncio.get_running_loop()
        client, server = _pair()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        rec = Recorder()
        transport = StampedTransport(loop, client, rec)  # type: ignore[arg-type]
        blob = bytes(range(256)) * 40_000  # 10 MB: far past the send buffer
        transport.write(blob[:5_000_000])
        transport.write(blob[5_000_000:])
        server.setblocking(False)
        got = bytearray()
        while len(got) < len(blob):
            try:
                got += server.recv(1 << 20)
            except BlockingIOError:
                await asyncio.sleep(0.001)
        assert bytes(got) == blob
        server.close()
        for _ in range(100):
            await asyncio.sleep(0.005)
            if rec.lost:
                break
        return bytes(got)

    asyncio.run(main())


def test_the_server_closing_is_connection_lost_once() -> None:
    async def main() -> list[Exception | None]:
        loop = asyncio.get_running_loop()
        client, server = _pair()
        rec = Recorder()
        transport = StampedTransport(loop, client, rec)  # type: ignore[arg-type]
        server.close()
        for _ in range(200):
            await asyncio.sleep(0.005)
            if rec.lost:
                break
        transport.abort()  # after the loss: nothing more happens
        await asyncio.sleep(0.01)
        assert transport.is_closing()
        return rec.lost

    assert asyncio.run(main()) == [None]


def test_the_pool_times_plain_http_reads_by_the_kernel_and_closes_every_connection() -> None:
    async def main() -> None:
        received: list[bytes] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            received.append(await reader.read(100))
            await asyncio.sleep(10)

        srv = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        pool = ConnectionPool("127.0.0.1", port, max_connections=2)
        a, b = await pool.acquire(), await pool.acquire()
        assert isinstance(a, HttpConnection) and isinstance(a.transport, StampedTransport)
        a.send(b"GET / HTTP/1.1\r\n\r\n")
        pool.release(b)  # a is held (mid-request), b idle: close() ends both
        pool.close()
        await asyncio.sleep(0.05)
        assert a.closed and b.closed and pool._open == 0
        srv.close()

    asyncio.run(main())


def test_the_clock_offset_is_read_between_two_monotonic_reads() -> None:
    offsets = [realtime_offset() for _ in range(50)]
    # The same offset to within a few µs each time (no clock step in a test): never the ~100 ns
    # bias of reading one clock before the other, which no test could see; a sanity bound.
    assert max(offsets) - min(offsets) < 50_000
    assert abs(offsets[0] - (time.time_ns() - time.monotonic_ns())) < 1_000_000
