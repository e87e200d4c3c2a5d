"""The synchronous client of a served sim: hello, reset, step, result, close.

Every request carries a sequence number and waits for its reply under a deadline. The client keeps
the internal (batched) form whatever framing the wire uses, so callers always see ``[N, ...]``
arrays. Failures are typed:

- an error frame from the sim -> :class:`RemoteError` (the connection stays usable);
- the connection dropped (the child died) -> :class:`SimCrashedError` with the owner's diagnosis
  (exit status and stderr tail when the sim was spawned by us);
- no reply within the deadline -> :class:`SimTimeoutError`; the owner kills a spawned child.

After a crash, a timeout or a reply with the wrong sequence number the client is *broken*: a late
reply could otherwise be taken for the answer to the next request, so every later call fails fast.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
from websockets.sync.client import ClientConnection, connect

from hud_pipelines.contract import Contract
from hud_pipelines.errors import RemoteError, SimCrashedError, SimError, SimTimeoutError, WireError
from hud_pipelines.wire.codec import packb, unpackb
from hud_pipelines.wire.messages import (
    DEFAULT_MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    Close,
    ErrorFrame,
    Framing,
    Hello,
    Observation,
    Reply,
    Request,
    Reset,
    Result,
    ResultRequest,
    ServerHello,
    Step,
    parse_reply,
    to_wire,
)

DEFAULT_STEP_TIMEOUT_S = 60.0
DEFAULT_CONNECT_TIMEOUT_S = 30.0


class SimClient:
    """Drives one served sim; use it as a context manager."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        framing: Framing | None = Framing.BATCHED,
        step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        diagnose: Callable[[], str] | None = None,
        on_timeout: Callable[[], None] | None = None,
    ) -> None:
        self.url = url
        self.step_timeout_s = step_timeout_s
        self._diagnose = diagnose or (lambda: "")
        self._on_timeout = on_timeout or (lambda: None)
        self._seq = itertools.count(1)
        self._broken: str | None = None
        try:
            self._ws: ClientConnection = connect(
                url,
                additional_headers={"Authorization": f"Bearer {token}"},
                compression=None,
                max_size=max_frame_bytes,
                open_timeout=connect_timeout_s,
                close_timeout=1,
            )
        except InvalidStatus as exc:
            body = exc.response.body.decode(errors="replace").strip() if exc.response.body else ""
            raise SimError(f"the sim at {url} refused the connection: HTTP {exc.response.status_code} {body}") from exc
        except (OSError, TimeoutError, WebSocketException) as exc:
            raise SimCrashedError(f"cannot connect to the sim at {url}: {exc}{self._diagnosis()}") from exc
        self._framing = framing or Framing.BATCHED
        self._ws.send(packb(to_wire(Hello(protocol=PROTOCOL_VERSION, framing=framing))))
        hello = self._receive("handshake", connect_timeout_s, framing=Framing.BATCHED)
        if not isinstance(hello, ServerHello):
            self.close()
            raise WireError(f"expected a hello frame from the sim, got {type(hello).__name__}")
        self.hello = hello
        self._framing = hello.framing
        self.contract = Contract.model_validate(hello.contract)

    @property
    def num_envs(self) -> int:
        return self.hello.num_envs

    # -- requests ----------------------------------------------------------------------------------

    def reset(self, tasks: list[dict[str, Any]] | dict[str, Any] | None = None) -> Observation:
        """Start an episode in every slot; ``tasks`` is one dict per slot (a single dict is used for all)."""
        if tasks is None:
            tasks = {}
        if isinstance(tasks, dict):
            tasks = [dict(tasks) for _ in range(self.num_envs)]
        reply = self._request(Reset(seq=next(self._seq), tasks=tasks), "reset")
        return self._expect(reply, Observation)

    def step(self, action: Any) -> Observation:
        """Send one ``[N, A]`` action frame (an ``[A]`` row is accepted for a single slot)."""
        array = np.asarray(action)
        if array.ndim == 1 and self.num_envs == 1 and array.shape[0] != 1:
            array = array[None]
        reply = self._request(Step(seq=next(self._seq), action=array), "step")
        return self._expect(reply, Observation)

    def result(self) -> Result:
        reply = self._request(ResultRequest(seq=next(self._seq)), "result")
        return self._expect(reply, Result)

    def close(self) -> None:
        """Say goodbye (best effort) and close the connection."""
        if self._broken is None:
            with contextlib.suppress(ConnectionClosed, OSError):
                self._ws.send(packb(to_wire(Close())))
        self._broken = self._broken or "the client was closed"
        self._ws.close()

    def __enter__(self) -> SimClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing ----------------------------------------------------------------------------------

    def _request(self, request: Request, phase: str) -> Reply:
        if self._broken is not None:
            raise SimError(f"the connection to {self.url} is unusable: {self._broken}")
        try:
            self._ws.send(packb(to_wire(request, self._framing)))
        except (ConnectionClosed, OSError) as exc:
            raise self._crashed(phase, exc) from exc
        reply = self._receive(phase, self.step_timeout_s, framing=self._framing)
        seq = getattr(request, "seq", None)
        reply_seq = getattr(reply, "seq", None)
        if isinstance(reply, ErrorFrame):
            if reply_seq not in (None, seq):
                self._broken = f"error frame for request {reply_seq} while waiting for {seq}"
                raise WireError(self._broken)
            raise RemoteError(reply.message, phase=reply.phase, slot=reply.slot, remote_traceback=reply.traceback)
        if reply_seq != seq:
            self._broken = f"reply numbered {reply_seq} to request {seq}: late or out-of-order reply"
            raise WireError(self._broken)
        return reply

    def _receive(self, phase: str, timeout_s: float, *, framing: Framing) -> Reply:
        try:
            frame = self._ws.recv(timeout=timeout_s)
        except TimeoutError as exc:
            self._broken = f"{phase} timed out"
            self._on_timeout()
            raise SimTimeoutError(
                f"the sim at {self.url} did not answer {phase} within {timeout_s:g} s; it is presumed hung"
                f"{self._diagnosis()}"
            ) from exc
        except (ConnectionClosed, OSError) as exc:
            raise self._crashed(phase, exc) from exc
        reply = parse_reply(unpackb(frame), framing)
        if isinstance(reply, ErrorFrame) and phase == "handshake":
            self._broken = reply.message
            raise RemoteError(reply.message, phase=reply.phase)
        return reply

    def _crashed(self, phase: str, exc: BaseException) -> SimCrashedError:
        self._broken = f"connection lost during {phase}"
        return SimCrashedError(f"the sim at {self.url} went away during {phase} ({exc}){self._diagnosis()}")

    def _diagnosis(self) -> str:
        text = self._diagnose()
        return f"\n{text}" if text else ""

    def _expect[R](self, reply: Reply, kind: type[R]) -> R:
        if not isinstance(reply, kind):
            self._broken = f"unexpected {type(reply).__name__} reply"
            raise WireError(f"expected a {kind.__name__} reply, got {type(reply).__name__}")
        return reply
