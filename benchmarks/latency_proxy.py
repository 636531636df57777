"""A userspace TCP proxy that adds latency, for benchmarks on a kernel without netem.

Each accepted connection is forwarded to one upstream (a lab node's sshd); every chunk read from either side
is held for `delay` seconds (half the round-trip time) before it is written to the other side, in order, so
each direction sees the delay once and a request/response pair sees the full RTT. Buffering is bounded per
direction (`MAX_QUEUED_CHUNKS`): a peer that sends faster than the other side reads is paused, not buffered
without limit. Half-close (EOF) is forwarded, so `ssh ... < file` behaves as on a real link.

Loopback only: listen and upstream addresses must be in 127.0.0.0/8, checked at start.

Run as its own process so its CPU is never charged to the tool being measured:

    python -m benchmarks.latency_proxy --delay-ms 10 --route 127.0.0.2:40001 --route 127.0.0.3:40002

prints one JSON line `{"127.0.0.2:40001": 45678, ...}` (upstream → listening port on the same address) once
every listener is up, then serves until SIGTERM/SIGINT. On exit it prints `{"accepted": {...}}` with the
number of connections accepted per upstream (a cross-check for the sshd log counts).

`--timestamps FILE` appends, per connection, `accept <t>` when it is accepted and `first <t> <bytes>` when the
client's first bytes arrive (its SSH identification line), `t` being CLOCK_MONOTONIC seconds
(`time.monotonic()`, the same clock in every process of the machine): benchmarks/startup.py measures the
time from a command's start to its first SSH packet with it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import ipaddress
import json
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TextIO

CHUNK = 65536
MAX_QUEUED_CHUNKS = 64  # per direction: at most 4 MiB in flight before the reader is paused


def require_loopback(address: str) -> str:
    if not ipaddress.ip_address(address).is_loopback:
        raise ValueError(f"{address} is not a loopback address: this proxy only runs on 127.0.0.0/8")
    return address


def parse_route(spec: str) -> tuple[str, int]:
    host, _, port = spec.rpartition(":")
    return require_loopback(host), int(port)


@dataclass
class Route:
    upstream_host: str
    upstream_port: int
    accepted: int = 0
    listen_port: int = 0
    server: asyncio.Server | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return f"{self.upstream_host}:{self.upstream_port}"


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float,
                on_first: Callable[[int], None] | None = None) -> None:
    """Copy reader → writer, each chunk delayed by `delay` from when it was read; forward EOF the same way.
    on_first(size) is called when the first chunk is read."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(MAX_QUEUED_CHUNKS)

    async def read_side() -> None:
        first = on_first
        try:
            while data := await reader.read(CHUNK):
                if first is not None:
                    first(len(data))
                    first = None
                await queue.put((loop.time() + delay, data))
        finally:
            await queue.put((loop.time() + delay, b""))  # b"": EOF (or the reader failed)

    async def write_side() -> None:
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    reading = asyncio.ensure_future(read_side())
    try:
        await write_side()
    finally:
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await reading


# asyncio keeps only weak references to tasks, and Python 3.11's start_server drops its own reference to a
# connection's handler task when the client's side closes: a handler still pumping the other direction was
# then garbage-collected mid-flight ("Task was destroyed but it is pending!"). Live handlers are held here.
_HANDLERS: set[asyncio.Task[None]] = set()


def _stamp(log: TextIO | None, route: Route, event: str, extra: str = "") -> None:
    if log is not None:
        log.write(f"{route.name} {event} {time.monotonic():.6f}{extra}\n")
        log.flush()


async def _serve_one(
    route: Route, delay: float, log: TextIO | None, client_reader: asyncio.StreamReader,
    client_writer: asyncio.StreamWriter,
) -> None:
    handler = asyncio.current_task()
    if handler is not None:
        _HANDLERS.add(handler)
        handler.add_done_callback(_HANDLERS.discard)
    route.accepted += 1
    _stamp(log, route, "accept")
    try:
        upstream_reader, upstream_writer = await asyncio.open_connection(
            route.upstream_host, route.upstream_port
        )
    except OSError:
        client_writer.close()
        return
    try:
        # Both directions until both have seen EOF (or failed: a reset on one side closes the other).
        await asyncio.gather(
            _pump(client_reader, upstream_writer, delay,
                  lambda size: _stamp(log, route, "first", f" {size}")),
            _pump(upstream_reader, client_writer, delay),
            return_exceptions=True,
        )
    except asyncio.CancelledError:
        pass  # shutting down; returning normally keeps asyncio 3.11 from logging the cancelled handler
    finally:
        for writer in (client_writer, upstream_writer):
            writer.close()


async def serve(routes: Sequence[Route], delay: float, ready: asyncio.Event | None = None,
                log: TextIO | None = None) -> None:
    """Listen for every route (on the upstream's own address, a free port) until cancelled."""
    for route in routes:
        handler = functools.partial(_serve_one, route, delay, log)
        route.server = await asyncio.start_server(handler, route.upstream_host, 0, backlog=256)
        route.listen_port = route.server.sockets[0].getsockname()[1]
    if ready is not None:
        ready.set()
    try:
        await asyncio.Event().wait()
    finally:
        for route in routes:
            if route.server is not None:
                route.server.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delay-ms", type=float, required=True, help="added delay per direction (RTT/2)")
    parser.add_argument("--route", action="append", default=[], help="upstream host:port (loopback)")
    parser.add_argument("--timestamps", help="append accept/first-byte times here (see above)")
    args = parser.parse_args(argv)
    routes = [Route(*parse_route(spec)) for spec in args.route]
    log = open(args.timestamps, "a") if args.timestamps else None  # noqa: SIM115  (open for the run)

    async def run() -> None:
        ready = asyncio.Event()
        task = asyncio.ensure_future(serve(routes, args.delay_ms / 1000, ready, log))
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, task.cancel)
        await ready.wait()
        print(json.dumps({route.name: route.listen_port for route in routes}), flush=True)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(run())
    print(json.dumps({"accepted": {route.name: route.accepted for route in routes}}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
