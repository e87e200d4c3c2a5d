"""The sim server: the sim on the main thread, serving on a background asyncio thread.

Sims such as MuJoCo with EGL, Isaac/Omniverse Kit and pygame insist on owning the main thread, so
the main thread runs :meth:`MainThreadExecutor.run_forever` and nothing else: it blocks on a queue
(no sleep-polling) and runs each sim touch (build, reset, step, result, close) in arrival order. An
optional idle hook runs whenever no touch arrived for ``idle_interval_s`` (where a Kit-style app is
pumped). The WebSocket server runs in an asyncio loop on a daemon thread and hands every request to
the main thread as one job, so a reply can never be read while its step is still running.

One connection drives the sim at a time; a second one is refused with HTTP 409 until the first
closes. Every connection must present the capability token (``Authorization: Bearer <token>`` or
``?token=``), checked before the WebSocket handshake completes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hmac
import logging
import queue
import threading
import traceback
from collections.abc import Callable
from http import HTTPStatus
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request as HttpRequest
from websockets.http11 import Response as HttpResponse

from hud_pipelines.errors import HudPipelinesError, WireError
from hud_pipelines.sim.bridge import EnvFault, GymBridge
from hud_pipelines.wire.codec import packb, unpackb
from hud_pipelines.wire.messages import (
    DEFAULT_MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    Close,
    ErrorFrame,
    Framing,
    Observation,
    Phase,
    Reply,
    Request,
    Reset,
    Result,
    ResultRequest,
    ServerHello,
    Step,
    parse_hello,
    parse_request,
    to_wire,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
SERVER_NAME = "hud-pipelines/1"
HANDSHAKE_TIMEOUT_S = 30.0
CLOSE_PROTOCOL_ERROR = 1002
CLOSE_TRY_AGAIN_LATER = 1013


class SimShuttingDown(HudPipelinesError):
    """A sim touch was requested after the main thread stopped serving."""


class MainThreadExecutor:
    """A blocking job queue drained by the thread that calls :meth:`run_forever`."""

    def __init__(self, idle_hook: Callable[[], None] | None = None, idle_interval_s: float = 0.01) -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._idle_hook = idle_hook
        self._idle_interval_s = idle_interval_s
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Queue ``fn`` for the main thread; safe to call from any thread."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                future.set_exception(SimShuttingDown("the sim is shutting down"))
            else:
                self._queue.put((fn, future))
        return future

    async def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the main thread and await its result from an asyncio loop."""
        return await asyncio.wrap_future(self.submit(fn))

    def stop(self) -> None:
        """Make :meth:`run_forever` return after the jobs queued so far."""
        self._queue.put(None)

    def close(self) -> None:
        """Refuse new jobs and fail the queued ones (the main thread no longer serves them)."""
        with self._lock:
            self._closed = True
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[1].set_exception(SimShuttingDown("the sim is shutting down"))

    def run_forever(self) -> None:
        """Run queued jobs until :meth:`stop`; call this on the main thread."""
        while True:
            if self._idle_hook is None:
                item = self._queue.get()
            else:
                try:
                    item = self._queue.get(timeout=self._idle_interval_s)
                except queue.Empty:
                    self._idle_hook()
                    continue
            if item is None:
                return
            fn, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # a shutdown signal mid-job must still release the waiter
                future.set_exception(exc if isinstance(exc, Exception) else SimShuttingDown(repr(exc)))
                if not isinstance(exc, Exception):
                    raise


class SimServer:
    """Serves one :class:`GymBridge` over WebSocket from a background asyncio thread."""

    def __init__(
        self,
        bridge: GymBridge,
        executor: MainThreadExecutor,
        *,
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        self.bridge = bridge
        self.executor = executor
        self.token = token
        self.host = host
        self.port = port
        self.max_frame_bytes = max_frame_bytes
        self._busy = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self, timeout_s: float = 30.0) -> int:
        """Start serving on a daemon thread; returns the bound port."""
        self._thread = threading.Thread(target=self._thread_main, name="hud-sim-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise RuntimeError(f"the sim server did not bind within {timeout_s} s")
        if self._failure is not None:
            raise self._failure
        return self.port

    def stop(self) -> None:
        if self._loop is not None and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to start() or logged; never kill the process from here
            self._failure = exc
            self._ready.set()
            log.exception("sim server thread failed")

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        server: Server
        async with serve(
            self._handle,
            self.host,
            self.port,
            process_request=self._admit,
            compression=None,
            max_size=self.max_frame_bytes,
        ) as server:
            self.port = int(next(iter(server.sockets)).getsockname()[1])
            self._ready.set()
            await self._stopped.wait()

    # -- admission ---------------------------------------------------------------------------------

    def _admit(self, connection: ServerConnection, request: HttpRequest) -> HttpResponse | None:
        offered = _bearer(request.headers.get("Authorization"))
        if offered is None:
            offered = parse_qs(urlsplit(request.path).query).get("token", [""])[0]
        if not hmac.compare_digest(offered.encode(), self.token.encode()):
            log.warning("refused a connection from %s: missing or wrong token", connection.remote_address)
            return connection.respond(HTTPStatus.UNAUTHORIZED, "missing or wrong capability token\n")
        if self._busy:
            return connection.respond(HTTPStatus.CONFLICT, "the sim is driven by another connection\n")
        return None

    # -- one connection ----------------------------------------------------------------------------

    async def _handle(self, ws: ServerConnection) -> None:
        if self._busy:
            await ws.close(CLOSE_TRY_AGAIN_LATER, "the sim is driven by another connection")
            return
        self._busy = True
        try:
            framing = await self._handshake(ws)
            if framing is not None:
                await self._serve_requests(ws, framing)
        except ConnectionClosed:
            pass
        finally:
            try:
                aborted = await self.executor.run(lambda: self.bridge.abort("client disconnected mid-episode"))
                if aborted:
                    log.warning("client left with slots %s running: their episodes are marked errored", aborted)
            except SimShuttingDown:
                pass
            self._busy = False

    async def _handshake(self, ws: ServerConnection) -> Framing | None:
        try:
            first = await asyncio.wait_for(ws.recv(), HANDSHAKE_TIMEOUT_S)
            hello = parse_hello(unpackb(first))
        except TimeoutError:
            await ws.close(CLOSE_PROTOCOL_ERROR, "no hello frame")
            return None
        except WireError as exc:
            await self._refuse(ws, str(exc))
            return None
        if hello.protocol != PROTOCOL_VERSION:
            await self._refuse(
                ws, f"protocol version {hello.protocol} is not supported; this sim speaks {PROTOCOL_VERSION}"
            )
            return None
        num_envs = self.bridge.num_envs
        framing = hello.framing or (Framing.SCALAR if num_envs == 1 else Framing.BATCHED)
        if framing is Framing.SCALAR and num_envs != 1:
            await self._refuse(ws, f"scalar framing needs num_envs == 1; this sim serves {num_envs} slots, use batched")
            return None
        contract = self.bridge.contract.model_dump(mode="json", exclude_none=True)
        reply = ServerHello(
            protocol=PROTOCOL_VERSION,
            framing=framing,
            num_envs=num_envs,
            contract=contract,
            server=SERVER_NAME,
            hold=self.bridge.hold.value,
            max_frame_bytes=self.max_frame_bytes,
        )
        await ws.send(packb(to_wire(reply, framing)))
        return framing

    async def _refuse(self, ws: ServerConnection, message: str) -> None:
        await ws.send(packb(to_wire(ErrorFrame(phase=Phase.HANDSHAKE, message=message))))
        await ws.close(CLOSE_PROTOCOL_ERROR, message[:120])

    async def _serve_requests(self, ws: ServerConnection, framing: Framing) -> None:
        last_seq = 0
        async for frame in ws:
            try:
                request = parse_request(unpackb(frame), framing)
            except WireError as exc:
                await ws.send(packb(to_wire(ErrorFrame(phase=Phase.DECODE, message=str(exc)))))
                continue
            if isinstance(request, Close):
                await ws.send(packb(to_wire(Close())))
                await ws.close()
                return
            if request.seq <= last_seq:
                message = f"sequence number {request.seq} is not above the last one ({last_seq}): duplicate or replayed request"
                await ws.send(packb(to_wire(ErrorFrame(phase=Phase.DECODE, seq=request.seq, message=message))))
                continue
            last_seq = request.seq
            reply = await self.executor.run(lambda: self._dispatch(request))
            await ws.send(packb(to_wire(reply, framing)))

    def _dispatch(self, request: Request) -> Reply:
        """Run one request against the bridge (on the main thread); every failure becomes an error frame."""
        phase = _PHASES[type(request)]
        seq = getattr(request, "seq", None)
        try:
            match request:
                case Reset(seq=seq, tasks=tasks):
                    return self.bridge.reset(tasks, seq)
                case Step(seq=seq, action=action):
                    return self.bridge.step(action, seq)
                case ResultRequest(seq=seq):
                    graded = self.bridge.result()
                    return Result(seq=seq, score=graded["score"], success=graded["success"], slots=graded["slots"])
                case Close():
                    return Close()
        except EnvFault as fault:
            return ErrorFrame(
                phase=fault.phase, seq=seq, slot=fault.slot, message=str(fault), traceback=fault.formatted
            )
        except HudPipelinesError as exc:
            return ErrorFrame(phase=phase, seq=seq, message=str(exc))
        except Exception as exc:
            log.exception("unexpected failure while serving %s", phase)
            return ErrorFrame(
                phase=phase, seq=seq, message=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()
            )


_PHASES: dict[type, Phase] = {Reset: Phase.RESET, Step: Phase.STEP, ResultRequest: Phase.RESULT, Close: Phase.SERVER}


def _bearer(header: str | None) -> str | None:
    if header and header.lower().startswith("bearer "):
        return header[7:].strip()
    return None


__all__ = ["MainThreadExecutor", "Observation", "SimServer"]
