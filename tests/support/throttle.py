"""A rate-limiting front for a real HTTP server: :class:`ThrottlingProxy` answers every request with
``429 Too Many Requests`` (``Retry-After``, a registry-style error body) until its window ends, then
forwards each new connection to the server byte for byte. It stands in front of the local OCI registry
(:mod:`e2e.registry`) for the test that a registry rate-limiting pulls for minutes delays a job but does
not fail it; the registry itself stays real.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

from e2e.registry import free_port

_BODY = json.dumps({"errors": [{"code": "TOOMANYREQUESTS", "message": "rate limit exceeded (test proxy)"}]}).encode()


class ThrottlingProxy:
    """``start()`` it, point clients at :attr:`address`, ``stop()`` it. For ``throttle_s`` seconds after
    ``start`` every request gets a 429 (counted in :attr:`throttled`); connections opened later are
    forwarded to ``upstream`` (counted in :attr:`forwarded`)."""

    def __init__(self, upstream: str, host: str, throttle_s: float, retry_after_s: int = 10) -> None:
        self.upstream_host, _, port = upstream.rpartition(":")
        self.upstream_port = int(port)
        self.host = host
        self.port = free_port(host)
        self.throttle_s = throttle_s
        self.retry_after_s = retry_after_s
        self.throttled = 0
        self.forwarded = 0
        self._until = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def throttling(self) -> bool:
        return time.monotonic() < self._until

    def start(self) -> "ThrottlingProxy":
        ready = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(asyncio.start_server(self._handle, self.host, self.port))
            except BaseException as e:  # noqa: BLE001 - reported by start()
                failed.append(e)
                ready.set()
                return
            self._until = time.monotonic() + self.throttle_s
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="throttling-proxy", daemon=True)
        self._thread.start()
        ready.wait(30)
        if failed:
            raise failed[0]
        return self

    def stop(self) -> None:
        loop, server = self._loop, self._server
        if loop is None or server is None:
            return

        async def close() -> None:
            server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> "ThrottlingProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if self.throttling:
                await self._refuse(reader, writer)
            else:
                await self._forward(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.CancelledError):
            pass  # the client went away, or stop() cancels what is still open
        finally:
            writer.close()

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A 429 to the connection's first request, then close (the client opens a new one to retry)."""
        await reader.readuntil(b"\r\n\r\n")
        self.throttled += 1
        writer.write(b"HTTP/1.1 429 Too Many Requests\r\n"
                     + f"Retry-After: {self.retry_after_s}\r\n".encode()
                     + b"Content-Type: application/json\r\n"
                     + f"Content-Length: {len(_BODY)}\r\n".encode()
                     + b"Connection: close\r\n\r\n" + _BODY)
        await writer.drain()

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        self.forwarded += 1

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(1 << 16):
                    dst.write(data)
                    await dst.drain()
            finally:
                if dst.can_write_eof():
                    try:
                        dst.write_eof()
                    except OSError:
                        pass

        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            up_writer.close()
