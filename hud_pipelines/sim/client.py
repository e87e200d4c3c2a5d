"""The synchronous client of a served sim: hello, reset, step, result, close.

Every request carries a sequence number and waits for its reply under a deadline. The client keeps
the internal (batched) form whatever framing the wire uses, so callers always see ``[N, ...]``
arrays (writable, native byte order). Failures are typed:

- an error frame from the sim -> :class:`RemoteError` (the connection stays usable);
- the connection refused (wrong token, sim busy) -> :class:`SimRefusedError` with the HTTP status;
- the connection dropped (the child died) -> :class:`SimCrashedError` with the owner's diagnosis
  (exit status and stderr tail when the sim was spawned by us) and, once the child exited, its
  ``returncode``;
- no reply within the deadline -> :class:`SimTimeoutError` with its ``deadline_s``; the owner kills
  a spawned child.

After a crash, a timeout or a reply with the wrong sequence number the client is *broken*: a late
reply could otherwise be taken for the answer to the next request, so every later call fails fast.

Steps can be pipelined: :meth:`send_step` sends without waiting and :meth:`receive_step` reads
that step's reply later, so a caller that already knows its next action (an open-loop chunk) keeps
the sim busy while it handles the previous observation. The server answers requests in order; a
reply read while waiting for a later request is kept until its caller asks for it.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from hud_pipelines.contract import Contract
from hud_pipelines.errors import (
    LinkClosed,
    LinkError,
    LinkRefused,
    RemoteError,
    SimCrashedError,
    SimError,
    SimRefusedError,
    SimTimeoutError,
    WireError,
)
from hud_pipelines.sim.link import WebSocketLink
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
    to_wire,
)
from hud_pipelines.wire.parse import parse_reply

DEFAULT_STEP_TIMEOUT_S = 60.0
DEFAULT_CONNECT_TIMEOUT_S = 30.0


class SimClient:
    """Drives one served sim; use it as a context manager.

    ``step_timeout_s`` bounds every step and result; ``reset_timeout_s`` (default: the same) bounds
    a reset, which may rebuild the env.
    """

    def __init__(
        self,
        url: str,
        token: str,
        *,
        framing: Framing | None = Framing.BATCHED,
        step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S,
        reset_timeout_s: float | None = None,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        diagnose: Callable[[], str] | None = None,
        on_timeout: Callable[[], None] | None = None,
        exit_status: Callable[[], int | None] | None = None,
    ) -> None:
        self.url = url
        self.step_timeout_s = step_timeout_s
        self.reset_timeout_s = reset_timeout_s if reset_timeout_s is not None else step_timeout_s
        self._diagnose = diagnose or (lambda: "")
        self._on_timeout = on_timeout or (lambda: None)
        self._exit_status = exit_status or (lambda: None)
        """The spawned child's exit status once it exited (read after the diagnosis, which waits for it)."""
        self._seq = itertools.count(1)
        self._broken: str | None = None
        self._pending: collections.deque[int] = collections.deque()
        """Sequence numbers sent whose replies have not been read, oldest first."""
        self._arrived: dict[int, Reply] = {}
        """Replies read while waiting for a later request, until their caller asks."""
        try:
            self._link = WebSocketLink(
                url,
                headers={"Authorization": f"Bearer {token}"},
                max_size=max_frame_bytes,
                timeout_s=connect_timeout_s,
            )
        except LinkRefused as exc:
            raise SimRefusedError(f"the sim at {url} refused the connection: {exc}", status=exc.status) from exc
        except (OSError, LinkError) as exc:
            diagnosis = self._diagnosis()
            raise SimCrashedError(
                f"cannot connect to the sim at {url}: {exc}{diagnosis}", returncode=self._exit_status()
            ) from exc
        try:
            self._send(Hello(protocol=PROTOCOL_VERSION, framing=framing), "handshake", connect_timeout_s)
            hello = self._receive("handshake", connect_timeout_s, Framing.BATCHED, None)
            if isinstance(hello, ErrorFrame):
                self._broken = hello.message
                raise RemoteError(hello.message, phase=hello.phase)
            if not isinstance(hello, ServerHello):
                raise WireError(f"expected a hello frame from the sim, got {type(hello).__name__}")
            self.contract = Contract.model_validate(hello.contract)
        except BaseException:
            self._broken = self._broken or "the handshake failed"
            self._link.close(timeout_s=0.2)
            raise
        self.hello = hello
        self.framing = hello.framing

    @property
    def num_envs(self) -> int:
        return self.hello.num_envs

    @property
    def in_flight(self) -> int:
        """Requests sent whose replies nobody has read yet (pipelined steps)."""
        return len(self._pending) + len(self._arrived)

    @property
    def usable(self) -> bool:
        """False after a crash, a timeout, a protocol violation or :meth:`close`."""
        return self._broken is None

    # -- requests ----------------------------------------------------------------------------------

    def reset(self, tasks: list[dict[str, Any]] | dict[str, Any] | None = None) -> Observation:
        """Start an episode in every slot; ``tasks`` is one dict per slot (a single dict is used for all)."""
        if tasks is None:
            tasks = {}
        if isinstance(tasks, dict):
            tasks = [dict(tasks) for _ in range(self.num_envs)]
        if len(tasks) != self.num_envs:
            raise SimError(f"reset needs one task per slot: {self.num_envs} slots, {len(tasks)} tasks")
        reply = self._request(Reset(seq=next(self._seq), tasks=tasks), "reset", self.reset_timeout_s)
        return self._expect(reply, Observation)

    def step(self, action: Any) -> Observation:
        """Send one ``[N, A]`` action frame (an ``[A]`` row is accepted for a single slot)."""
        return self.receive_step(self.send_step(action))

    def send_step(self, action: Any) -> int:
        """Send a step without waiting for its reply; returns its ``seq`` for :meth:`receive_step`."""
        array = np.asarray(action)
        if self.num_envs == 1 and array.ndim <= 1:
            array = array.reshape(1, -1)
        return self._post(Step(seq=next(self._seq), action=array), "step", self.step_timeout_s)

    def receive_step(self, seq: int) -> Observation:
        """The observation that answers the step numbered ``seq`` (waits at most ``step_timeout_s``)."""
        return self._expect(self._await(seq, "step", self.step_timeout_s), Observation)

    def result(self) -> Result:
        reply = self._request(ResultRequest(seq=next(self._seq)), "result", self.step_timeout_s)
        return self._expect(reply, Result)

    def close(self) -> None:
        """Say goodbye (best effort) and close the connection; safe to call twice."""
        if self._broken is None:
            with contextlib.suppress(LinkError, OSError, TimeoutError):
                self._link.send(packb(to_wire(Close())), 1.0)
        self._broken = self._broken or "the client was closed"
        self._link.close()

    def __enter__(self) -> SimClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing ----------------------------------------------------------------------------------

    def _request(self, request: Reset | Step | ResultRequest, phase: str, timeout_s: float) -> Reply:
        return self._await(self._post(request, phase, timeout_s), phase, timeout_s)

    def _post(self, request: Reset | Step | ResultRequest, phase: str, timeout_s: float) -> int:
        """Send a numbered request; its reply is read by :meth:`_await`."""
        self._require_usable()
        self._send(request, phase, timeout_s)
        self._pending.append(request.seq)
        return request.seq

    def _await(self, seq: int, phase: str, timeout_s: float) -> Reply:
        """The reply to request ``seq``: replies arrive in request order, earlier ones are kept."""
        while seq not in self._arrived:
            self._require_usable()
            if seq not in self._pending:
                raise SimError(f"no request numbered {seq} is waiting for a reply from {self.url}")
            expected = self._pending[0]
            reply = self._receive(phase, timeout_s, self.framing, self.num_envs)
            reply_seq = getattr(reply, "seq", None)
            if isinstance(reply, ErrorFrame) and reply_seq not in (None, expected):
                raise self._violation(f"error frame for request {reply_seq} while waiting for {expected}")
            if not isinstance(reply, ErrorFrame) and reply_seq != expected:
                raise self._violation(f"reply numbered {reply_seq} to request {expected}: late or out-of-order reply")
            self._pending.popleft()
            self._arrived[expected] = reply
        reply = self._arrived.pop(seq)
        if isinstance(reply, ErrorFrame):
            raise RemoteError(reply.message, phase=reply.phase, slot=reply.slot, remote_traceback=reply.traceback)
        return reply

    def _require_usable(self) -> None:
        if self._broken is not None:
            raise SimError(f"the connection to {self.url} is unusable: {self._broken}")

    def _violation(self, message: str) -> WireError:
        """The sim broke the protocol: this connection can no longer be trusted."""
        self._broken = message
        self._link.abort()
        return WireError(message)

    def _send(self, message: Request | Hello, phase: str, timeout_s: float) -> None:
        frame = packb(to_wire(message, self.framing if isinstance(message, Reset | Step) else Framing.BATCHED))
        try:
            self._link.send(frame, timeout_s)
        except TimeoutError as exc:
            raise self._timed_out(phase, timeout_s) from exc
        except (LinkError, OSError) as exc:
            raise self._crashed(phase, exc) from exc

    def _receive(self, phase: str, timeout_s: float, framing: Framing, num_slots: int | None) -> Reply:
        try:
            frame = self._link.recv(timeout_s)
        except TimeoutError as exc:
            raise self._timed_out(phase, timeout_s) from exc
        except (LinkError, OSError) as exc:
            raise self._crashed(phase, exc) from exc
        try:
            return parse_reply(unpackb(frame), framing, num_slots)
        except WireError as exc:
            self._broken = f"undecodable reply during {phase}: {exc}"
            self._link.abort()
            raise

    def _timed_out(self, phase: str, timeout_s: float) -> SimTimeoutError:
        self._broken = f"{phase} timed out"
        self._link.abort()  # a late reply must never be read as the answer to a later request
        self._on_timeout()
        return SimTimeoutError(
            f"the sim at {self.url} did not answer {phase} within {timeout_s:g} s; it is presumed hung"
            f"{self._diagnosis()}",
            deadline_s=timeout_s,
        )

    def _crashed(self, phase: str, exc: BaseException) -> SimCrashedError:
        self._broken = f"connection lost during {phase}"
        self._link.abort()
        code = f" (close code {exc.code})" if isinstance(exc, LinkClosed) and exc.code is not None else ""
        diagnosis = self._diagnosis()
        return SimCrashedError(
            f"the sim at {self.url} went away during {phase}{code}: {exc}{diagnosis}", returncode=self._exit_status()
        )

    def _diagnosis(self) -> str:
        text = self._diagnose()
        return f"\n{text}" if text else ""

    def _expect[R](self, reply: Reply, kind: type[R]) -> R:
        if not isinstance(reply, kind):
            raise self._violation(f"expected a {kind.__name__} reply, got {type(reply).__name__}")
        return reply
