"""The worker's HTTP/1.1 client (http.py) (http.py): its connection pool against a tiny
asyncio server (tests/mini_http_server.py) and against a real `ctax sim`.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from mini_http_server import (  # noqa: E402
    SSE_BODY,
    MiniServer,
    exchange,
    make_worker,
    plain_response,
    request_bytes,
    run,
    sse_response,
)
from sim_server import running_sim  # noqa: E402

from connector_tax.loadgen.worker.http import ConnectionPool, HttpConnection, Response  # noqa: E402
from connector_tax.loadgen.worker.sse import SSEReader  # noqa: E402


# -- the pool against the mini server ---------------------------------------------------
def test_sequential_requests_reuse_one_connection() -> None:
    async def main() -> None:
        srv = MiniServer()
        await srv.start()
        pool = ConnectionPool("127.0.0.1", srv.port, max_connections=8)
        conns = set()
        for i in range(25):
            status, raw, conn = await exchange(pool, request_bytes(srv.port, rid=str(i)))
            assert (status, raw) == (200, SSE_BODY)
            conns.add(id(conn))
        assert len(conns) == 1
        assert srv.requests_per_conn == [25]
        pool.close()
        await srv.stop()

    run(main)


def test_pool_bound_is_respected() -> None:
    async def main() -> None:
        srv = MiniServer(delay_s=0.03)
        await srv.start()
        pool = ConnectionPool("127.0.0.1", srv.port, max_connections=3)
        results = await asyncio.gather(*(exchange(pool, request_bytes(srv.port)) for _ in range(12)))
        assert [(s, r) for s, r, _ in results] == [(200, SSE_BODY)] * 12
        assert len({id(c) for _, _, c in results}) == 3
        assert srv.max_open == 3 and srv.max_active == 3
        assert sorted(srv.requests_per_conn) == [4, 4, 4]
        pool.close()
        await srv.stop()

    run(main)


def test_idle_connection_closed_by_server_is_not_reused() -> None:
    async def main() -> None:
        srv = MiniServer(idle_close_s=0.02)
        await srv.start()
        pool = ConnectionPool("127.0.0.1", srv.port, max_connections=4)
        s1, _, c1 = await exchange(pool, request_bytes(srv.port))
        for _ in range(200):  # the server closes it after 20 ms; the pool must notice (a busy host's loop is late)
            await asyncio.sleep(0.05)
            if c1.closed:
                break
        assert c1.closed
        s2, raw, c2 = await exchange(pool, request_bytes(srv.port))
        assert (s1, s2, raw) == (200, 200, SSE_BODY)
        assert c2 is not c1
        assert srv.requests_per_conn == [1, 1]
        pool.close()
        await srv.stop()

    run(main)


@pytest.mark.parametrize("chunked", [False, True])
def test_non_200_body_read_fully_and_connection_reused(chunked: bool) -> None:
    error = json.dumps({"error": {"message": "boom " + "x" * 3000, "type": "InternalServerError"}}).encode()

    def behave(srv: MiniServer, conn: int, req: int, data: bytes) -> bytes:
        return plain_response("500 Internal Server Error", error, chunked=chunked) if req == 0 else sse_response()

    async def main() -> None:
        srv = MiniServer(behave)
        await srv.start()
        pool = ConnectionPool("127.0.0.1", srv.port, max_connections=4)
        s1, raw1, c1 = await exchange(pool, request_bytes(srv.port))
        s2, raw2, c2 = await exchange(pool, request_bytes(srv.port))
        assert (s1, raw1) == (500, error)
        assert (s2, raw2) == (200, SSE_BODY)
        assert c1 is c2
        assert srv.requests_per_conn == [2]
        pool.close()
        await srv.stop()

    run(main)


def test_connection_close_response_is_not_reused() -> None:
    def behave(srv: MiniServer, conn: int, req: int, data: bytes) -> bytes:
        return plain_response("404 Not Found", b'{"detail":"Not Found"}', close=True)

    async def main() -> None:
        srv = MiniServer(behave)
        await srv.start()
        pool = ConnectionPool("127.0.0.1", srv.port, max_connections=4)
        for _ in range(3):
            status, raw, conn = await exchange(pool, request_bytes(srv.port))
            assert (status, raw, conn.keep_alive) == (404, b'{"detail":"Not Found"}', False)
        assert srv.requests_per_conn == [1, 1, 1]
        pool.close()
        await srv.stop()

    run(main)


# -- against ctax sim -------------------------------------------------------------------
@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory):
    with running_sim(tmp_path_factory.mktemp("http-sim"), connector="plain") as s:
        yield s


def test_keep_alive_against_the_sim(sim) -> None:
    async def main() -> None:
        pool = ConnectionPool("127.0.0.1", sim.port, max_connections=4)
        worker = make_worker(sim.port)
        conns = set()
        for i in range(15):
            body = worker.builder.body(f"http_keepalive-{i}", 16, 3, None)
            data = (worker._head % (f"http_keepalive-{i}", len(body))).encode() + body
            conn = await pool.acquire()
            response = conn.send(data)
            assert await response.wait_headers() == 200
            reader = SSEReader()
            async for batch in response.iter_chunks():
                for t_ns, chunk in batch:
                    reader.feed(t_ns, chunk)
            reader.finish()
            pool.release(conn)
            conns.add(id(conn))
            # The sim, like vLLM, may put two tokens in one chunk when its stream lags (a loaded
            # machine): usage says 3, the chunks 2 or 3.
            assert (reader.done, reader.error) == (True, None) and 2 <= reader.chunks <= 3
            assert reader.usage == {"prompt_tokens": 16, "total_tokens": 19, "completion_tokens": 3}
        assert len(conns) == 1
        assert conn.used == 15
        # A 400 from the sim is read to its end and the connection stays in use.
        conn = await pool.acquire()
        response = conn.send(request_bytes(sim.port, b'{"model":"nope","prompt":[1,2]}'))
        assert await response.wait_headers() == 404
        error = json.loads(await response.read_all())["error"]
        assert error["code"] == 404 and "nope" in error["message"]
        pool.release(conn)
        assert (await pool.acquire()) is conn
        assert conn.used == 16
        pool.close()

    run(main)


def test_pool_bound_against_the_sim(sim) -> None:
    import psutil

    async def main() -> None:
        pool = ConnectionPool("127.0.0.1", sim.port, max_connections=2)
        worker = make_worker(sim.port)

        async def one(i: int) -> tuple[int, bytes, Any]:
            rid = f"http_bound-{i}"
            body = worker.builder.body(rid, 16, 4, None)
            return await exchange(pool, (worker._head % (rid, len(body))).encode() + body)

        results = await asyncio.gather(*(one(i) for i in range(8)))
        assert [s for s, _, _ in results] == [200] * 8
        assert len({id(c) for _, _, c in results}) == 2
        # The kernel's socket table agrees: two connections to the sim, no more.
        mine = [
            c
            for c in psutil.Process().net_connections("tcp")
            if c.raddr and c.raddr.port == sim.port and c.status == psutil.CONN_ESTABLISHED
        ]
        assert len(mine) == 2
        pool.close()

    run(main)


def test_one_read_is_one_body_entry_however_many_http_chunks_it_holds() -> None:
    async def main() -> list[tuple[int, bytes]]:
        conn = HttpConnection(lambda c: None)
        conn.response = Response()
        head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        events = [b'data: {"n":%d}\n\n' % i for i in range(3)]
        chunked = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events)
        conn.data_received(head + chunked)  # headers and three HTTP chunks in one read
        conn.data_received(b"%x\r\n%s\r\n0\r\n\r\n" % (len(events[0]), events[0]))
        assert conn.response.complete
        return conn.response.chunks

    entries = asyncio.run(main())
    assert [body for _, body in entries] == [
        b"".join(b'data: {"n":%d}\n\n' % i for i in range(3)),
        b'data: {"n":0}\n\n',
    ]
    assert entries[0][0] < entries[1][0]  # each stamped when its read arrived


def test_spare_connections_are_restocked_in_the_background_within_the_bound() -> None:
    async def main() -> None:
        srv = MiniServer()
        await srv.start()
        pool = ConnectionPool("127.0.0.1", srv.port, max_connections=5, spare=2)
        await pool.prewarm(2)
        held = [pool.try_acquire(), pool.try_acquire()]
        assert all(held) and pool.try_acquire() is None  # the stock is gone for now...
        for _ in range(1000):
            await asyncio.sleep(0.01)
            if len(pool._idle) == 2:
                break
        assert len(pool._idle) == 2  # ...and back without anyone waiting for a handshake
        taken = [pool.try_acquire(), pool.try_acquire()]
        for _ in range(1000):  # one spare comes back (a loaded host's handshake may take a while)...
            await asyncio.sleep(0.01)
            if pool._idle:
                break
        await asyncio.sleep(0.2)  # ...and no second one follows it
        assert len(pool._idle) == 1  # the bound: 4 held + 1 idle = max_connections
        assert len({id(c) for c in held + taken}) == 4 and srv.max_open == 5
        pool.close()
        await srv.stop()

    run(main)
