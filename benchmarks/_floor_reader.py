"""The floor of any client that reads each streamed chunk as it arrives: a bare uvloop Protocol
that sends the same requests as the CPU-cost cells (Poisson, 16-token prompts, `--tokens`-token
streams, one connection per request), stamps each read and keeps its bytes, and parses nothing.

    python benchmarks/_floor_reader.py URL RATE SECONDS [--tokens 64] [--seed N]

Its CPU per chunk is what waking for a read costs on this host (the kernel's wake-up, epoll,
recv and one Python callback), which no load generator that times chunks as they arrive can go
below. Prints one JSON line: requests, reads per request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from urllib.parse import urlsplit

import uvloop


def body(tokens: int) -> bytes:
    return json.dumps(
        {"model": "bench-model", "prompt": list(range(16)), "max_tokens": tokens, "stream": True}
    ).encode()


class Reader(asyncio.Protocol):
    def __init__(self, request: bytes, done: asyncio.Future[int]) -> None:
        self.request, self.done = request, done
        self.reads: list[tuple[int, bytes]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.reads.append((time.monotonic_ns(), data))
        if data.endswith(b"0\r\n\r\n"):  # the chunked body's last chunk (the server writes it alone at the end)
            self.transport.close()
            if not self.done.done():
                self.done.set_result(len(self.reads))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(len(self.reads))


async def one(host: str, port: int, n: int, payload: bytes) -> int:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"X-Request-Id: floor-{n}\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    await loop.create_connection(lambda: Reader(head.encode() + payload, done), host, port)
    return await done


async def main(url: str, rate: float, seconds: float, tokens: int, seed: int) -> None:
    payload = body(tokens)
    parts = urlsplit(url)
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    tasks, t, start = [], 0.0, time.monotonic()
    while True:
        t += rng.expovariate(rate)
        if t >= seconds:
            break
        await asyncio.sleep(max(0.0, start + t - time.monotonic()))
        tasks.append(loop.create_task(one(parts.hostname or "127.0.0.1", parts.port or 80, len(tasks), payload)))
    reads = await asyncio.gather(*tasks)
    print(json.dumps({"requests": len(reads), "reads_per_request": round(sum(reads) / max(1, len(reads)), 2)}))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("url")
    p.add_argument("rate", type=float)
    p.add_argument("seconds", type=float)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    uvloop.run(main(a.url, a.rate, a.seconds, a.tokens, a.seed))
    sys.exit(0)
