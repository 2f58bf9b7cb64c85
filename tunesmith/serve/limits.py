"""What keeps one request from starving the server: the body limit (--max_request_bytes, held while a body
arrives, with or without a Content-Length), a whole reply cancelled when its client leaves (a stream's
generator is closed by Starlette then; a whole reply's handler only waits, so a watcher listens for the
disconnect), and a shutdown that cancels every job instead of waiting minutes for them to finish."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..generation import Request as Job
from ..generation.worker import Scheduler
from .protocol import APIError


class _BodyTooLarge(Exception):
    """Raised from inside the app's `receive` when a body passes the limit; BodyLimit answers it."""


class BodyLimit:
    """ASGI middleware: a body over the limit is refused with a 413 in OpenAI's error shape, at once when its
    Content-Length says so, else as soon as the bytes received pass the limit (a chunked body), so no more
    than the limit is ever read. The connection closes after the refusal: the rest of the body is not read."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = Headers(scope=scope).get("content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await self._refuse(f"the request body has {length} bytes", scope, receive, send)
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:
                raise _BodyTooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _BodyTooLarge:
            await self._refuse(f"the request body (sent without a Content-Length) passed {self.limit} bytes", scope,
                               receive, send)

    async def _refuse(self, what: str, scope: Scope, receive: Receive, send: Send) -> None:
        error = APIError(413, f"{what}, more than this server's limit of {self.limit} (--max_request_bytes)",
                         code="request_too_large")
        await JSONResponse(error.body(), status_code=413, headers={"Connection": "close"})(scope, receive, send)


@asynccontextmanager
async def cancelled_when_gone(request: Request, jobs: Sequence[Job]) -> AsyncIterator[None]:
    """While a whole (non-streamed) reply is awaited, its client leaving cancels its jobs: they end
    "cancelled" at the engine's next step, and the rows they held go to other requests. The body has been
    read, so the next message the server receives is the disconnect."""

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        for job in jobs:
            job.cancelled = True

    watcher = asyncio.create_task(watch())
    try:
        yield
    finally:
        watcher.cancel()


def cancelled_error() -> APIError:
    """A reply the engine cancelled while its client still waits: only a shutdown does that."""
    return APIError(503, "the server is shutting down and cancelled this request before its reply finished; send it "
                    "again once the server is back", code="server_shutting_down")


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, whose graceful shutdown (SIGTERM, Ctrl-C) waits for every open request: a reply
    can take minutes, so every job is cancelled first; each request then ends at the engine's next step
    (a 503 for a whole reply, an error event for a stream) and the process exits within seconds."""

    def __init__(self, config: uvicorn.Config, scheduler: Scheduler) -> None:
        super().__init__(config)
        self.scheduler = scheduler

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.scheduler.cancel_all()
        await super().shutdown(sockets)


def serve_forever(app: FastAPI, listener: socket.socket) -> None:
    """Serve the app on a bound socket until a shutdown signal."""
    host, port = listener.getsockname()[:2]
    config = uvicorn.Config(app, host=host, port=port, log_level="info")
    _Uvicorn(config, app.state.server.scheduler).run(sockets=[listener])
