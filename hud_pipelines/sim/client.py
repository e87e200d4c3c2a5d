"""The synchronous client of a served sim: hello, reset, step, result, close.

Every request carries a sequence number and waits for its reply under a deadline. The client keeps
the internal (batched) form whatever framing the wire uses, so callers always see ``[N, ...]``
arrays (writable, native byte order). Failures are typed:

- an error frame from the sim -> :class:`RemoteError` (the connection stays usable), except one of
  phase ``server``: the sim is shutting down, as if its connection had closed (``SimCrashedError``);
- the connection refused (wrong token, sim busy) -> :class:`SimRefusedError` with the HTTP status;
- the connection dropped (the child died) -> :class:`SimCrashedError` with the owner's diagnosis
  (exit status and stderr tail when the sim was spawned by us) and, once the child exited, its
  ``returncode``;
- no reply within the deadline -> :class:`SimTimeoutError` with its ``deadline_s``; the owner kills
  a spawned child.

The protocol's bookkeeping (sequence numbers, pending replies, the broken state) is a sans-I/O
:class:`~hud_pipelines.wire.client_session.ClientSession`; this class is its I/O shell: it moves
frames over a :class:`~hud_pipelines.sim.link.Link`, applies deadlines and turns transport failures
into typed errors. After a crash, a timeout or a reply with the wrong sequence number the client is
*broken*: a late reply could otherwise be taken for the answer to the next request, so every later
call fails fast. :meth:`SimClient.in_process` runs the same client against a bridge in this process
(a real server session, no socket), for fast tests of the code that drives sims.

Steps can be pipelined: :meth:`send_step` sends without waiting and :meth:`receive_step` reads
that step's reply later, so a caller that already knows its next action (an open-loop chunk) keeps
the sim busy while it handles the previous observation. The server answers requests in order; a
reply read while waiting for a later request is kept until its caller asks for it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pydantic

from hud_pipelines.closing import Closeable
from hud_pipelines.contract import Contract
from hud_pipelines.errors import (
    LinkClosed,
    LinkError,
    LinkRefused,
    Phase,
    RemoteError,
    SimContractError,
    SimCrashedError,
    SimError,
    SimRefusedError,
    SimTimeoutError,
    WireError,
)
from hud_pipelines.sim.link import Link, WebSocketLink
from hud_pipelines.wire.client_session import ClientSession
from hud_pipelines.wire.messages import (
    DEFAULT_MAX_FRAME_BYTES,
    CloseCode,
    Framing,
    Observation,
    Reply,
    Result,
    ServerHello,
)

if TYPE_CHECKING:
    from hud_pipelines.sim.bridge import GymBridge

_BROKEN_PROTOCOL_CODES = frozenset({CloseCode.PROTOCOL_ERROR, 1003, 1007})
"""Close codes of a connection one side's WebSocket layer dropped for bytes that were not the protocol (RFC 6455:
a protocol error, a data type it cannot take, a text frame that is not UTF-8): the link broke, the sim lives."""

DEFAULT_STEP_TIMEOUT_S = 60.0
DEFAULT_CONNECT_TIMEOUT_S = 30.0


class SimClient(Closeable):
    """Drives one served sim; use it as a context manager, from one thread at a time: its requests and their
    replies pair up in order on one connection, so threads that share a client get each other's episodes (give
    each thread a client of its own).

    ``step_timeout_s`` bounds every step and result; ``reset_timeout_s`` (default: the same) bounds
    a reset, which may rebuild the env. ``link`` replaces the WebSocket connection to ``url`` (see
    :meth:`in_process`); ``local_socket`` reaches the server of ``url`` through a Unix socket of this host that
    it named (:attr:`SimProcess.local_socket`).
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
        link: Link | None = None,
        local_socket: str | None = None,
    ) -> None:
        self.url = url
        self.step_timeout_s = step_timeout_s
        self.reset_timeout_s = reset_timeout_s if reset_timeout_s is not None else step_timeout_s
        self._diagnose = diagnose or (lambda: "")
        self._on_timeout = on_timeout or (lambda: None)
        self._exit_status = exit_status or (lambda: None)
        """The spawned child's exit status once it exited (read after the diagnosis, which waits for it)."""
        self._session = ClientSession(framing, peer=url)
        self._link = (
            link if link is not None else self._connect(token, max_frame_bytes, connect_timeout_s, local_socket)
        )
        try:
            self._send(self._session.hello(), "handshake", connect_timeout_s)
            try:
                self.hello: ServerHello = self._session.receive_hello(self._receive("handshake", connect_timeout_s))
            except WireError:  # the sim broke the protocol: the connection can no longer be trusted
                self._link.abort()
                raise
            try:
                self.contract = Contract.model_validate(self.hello.contract)
            except pydantic.ValidationError as exc:  # a sim written elsewhere, or of another version
                raise SimContractError(f"the sim at {url} announced a contract that is not one: {exc}") from None
            self._session.hold_to({name: (f.dtype, f.shape) for name, f in self.contract.observation_features.items()})
            if isinstance(self._link, WebSocketLink):  # a server's larger bound is the client's too from now on
                self._link.receive_up_to(max(max_frame_bytes, self.hello.max_frame_bytes))
        except BaseException:
            self._session.fail("the handshake failed")
            self._link.close(timeout_s=0.2)
            raise
        self.framing = self.hello.framing
        self.num_envs = self.hello.num_envs

    @classmethod
    def in_process(cls, bridge: GymBridge, *, framing: Framing | None = Framing.BATCHED) -> SimClient:
        """A client of ``bridge`` served in this process through a real server session, without a socket."""
        from hud_pipelines.sim.in_process import InProcessLink

        link = InProcessLink(bridge)
        return cls(link.url, "", framing=framing, link=link)

    def _connect(self, token: str, max_frame_bytes: int, timeout_s: float, local_socket: str | None) -> Link:
        try:
            return WebSocketLink(
                self.url,
                headers={"Authorization": f"Bearer {token}"},
                max_size=max_frame_bytes,
                timeout_s=timeout_s,
                local_socket=local_socket,
            )
        except LinkRefused as exc:
            refused = f"the sim at {self.url} refused the connection: {exc}"
            raise SimRefusedError(refused, status=exc.status, running_for_s=exc.running_for_s) from exc
        except (OSError, LinkError) as exc:
            through = f" (through its local socket {local_socket})" if local_socket is not None else ""
            diagnosis = self._diagnosis()
            waited = (
                f" (waited {timeout_s:g} s for the connection and its handshake)"
                if isinstance(exc, TimeoutError)
                else ""
            )
            raise SimCrashedError(
                f"cannot connect to the sim at {self.url}{through}: {exc}{waited}{diagnosis}",
                returncode=self._exit_status(),
            ) from exc

    @property
    def in_flight(self) -> int:
        """Requests sent whose replies nobody has read yet (pipelined steps)."""
        return self._session.in_flight

    @property
    def usable(self) -> bool:
        """False after a crash, a timeout, a protocol violation or :meth:`close`."""
        return self._session.usable

    def still_connected(self) -> bool:
        """Whether an idle client can serve the next instance: usable, and its connection still open with nothing
        waiting (its sim restarted, or it or a proxy closed the connection for idling, since the last reply)."""
        return self.usable and self._link.quiet()

    # -- requests ----------------------------------------------------------------------------------

    def reset(self, tasks: list[dict[str, Any]] | dict[str, Any] | None = None) -> Observation:
        """Start an episode in every slot; ``tasks`` is one dict per slot (a single dict is used for all)."""
        if tasks is None:
            tasks = {}
        if isinstance(tasks, dict):
            tasks = [dict(tasks) for _ in range(self.num_envs)]
        seq = self._post(self._session.reset(tasks), "reset", self.reset_timeout_s)
        return self._expect(self._await(seq, "reset", self.reset_timeout_s), Observation)

    def step(self, action: Any) -> Observation:
        """Send one ``[N, A]`` action frame (an ``[A]`` row is accepted for a single slot)."""
        return self.receive_step(self.send_step(action))

    def send_step(self, action: Any) -> int:
        """Send a step without waiting for its reply; returns its ``seq`` for :meth:`receive_step`."""
        return self._post(self._session.step(action), "step", self.step_timeout_s)

    def receive_step(self, seq: int) -> Observation:
        """The observation that answers the step numbered ``seq`` (waits at most ``step_timeout_s``)."""
        return self._expect(self._await(seq, "step", self.step_timeout_s), Observation)

    def result(self) -> Result:
        seq = self._post(self._session.result(), "result", self.step_timeout_s)
        return self._expect(self._await(seq, "result", self.step_timeout_s), Result)

    def close(self) -> None:
        """Say goodbye (best effort) and close the connection; safe to call twice."""
        goodbye = self._session.close()
        if goodbye is not None:
            with contextlib.suppress(LinkError, OSError, TimeoutError):
                self._link.send(goodbye, 1.0)
        self._link.close()

    # -- plumbing ----------------------------------------------------------------------------------

    def _post(self, request: tuple[int, bytes], phase: str, timeout_s: float) -> int:
        """Send a numbered request frame; its reply is read by :meth:`_await`."""
        seq, frame = request
        self._send(frame, phase, timeout_s)
        return seq

    def _await(self, seq: int, phase: str, timeout_s: float) -> Reply:
        """The reply to request ``seq``: replies arrive in request order, earlier ones are kept."""
        while (reply := self._take(seq, phase)) is None:
            frame = self._receive(phase, timeout_s)
            try:
                self._session.receive(frame)
            except WireError:  # the sim broke the protocol: the connection can no longer be trusted
                self._link.abort()
                raise
        return reply

    def _take(self, seq: int, phase: str) -> Reply | None:
        try:
            return self._session.take(seq)
        except RemoteError as exc:
            if exc.phase == Phase.SERVER:  # it answers before its 1001 close: the sim went, as when the close wins
                raise self._crashed(phase, exc) from exc
            raise

    def _expect[R: Observation | Result](self, reply: Reply, kind: type[R]) -> R:
        try:
            return self._session.expect(reply, kind)
        except WireError:
            self._link.abort()
            raise

    def _send(self, frame: bytes, phase: str, timeout_s: float) -> None:
        try:
            self._link.send(frame, timeout_s)
        except TimeoutError as exc:
            raise self._timed_out(phase, timeout_s) from exc
        except (LinkError, OSError) as exc:
            if self._session.in_flight > 1:
                # A step sent ahead found the connection gone, but the replies to the requests before it
                # may be in the socket already: they are read first (the steps before a crash are kept),
                # and reading on past them reports the crash.
                return
            raise self._crashed(phase, exc) from exc

    def _receive(self, phase: str, timeout_s: float) -> bytes | bytearray | memoryview | str:
        try:
            return self._link.recv(timeout_s)
        except TimeoutError as exc:
            raise self._timed_out(phase, timeout_s) from exc
        except (LinkError, OSError) as exc:
            raise self._crashed(phase, exc) from exc

    def _timed_out(self, phase: str, timeout_s: float) -> SimTimeoutError:
        self._session.fail(f"{phase} timed out")
        # The child's stacks are taken before the connection drops: its serving thread is then idle, and
        # faulthandler walking a thread that runs Python at the same time can crash the child mid-dump.
        try:
            self._on_timeout()
        finally:
            self._link.abort()  # a late reply must never be read as the answer to a later request
        return SimTimeoutError(
            f"the sim at {self.url} did not answer {phase} within {timeout_s:g} s; it is presumed hung"
            f"{self._diagnosis()}",
            deadline_s=timeout_s,
        )

    def _crashed(self, phase: str, exc: BaseException) -> SimError:
        self._session.fail(f"connection lost during {phase}")
        self._link.abort()
        if isinstance(exc, LinkClosed) and exc.code == CloseCode.IDLE_TIMEOUT:  # alive: it let a silent client go
            return SimError(
                f"the sim at {self.url} closed the connection before {phase}: no request reached it for its "
                f"idle timeout ({exc.reason or 'idle'}); the policy took longer than that between steps: "
                "start the server with a larger --idle-timeout-s"
            )
        if isinstance(exc, LinkClosed) and exc.code == CloseCode.MESSAGE_TOO_BIG:  # alive: a frame was too large
            return SimError(
                f"the connection to the sim at {self.url} closed during {phase}: a message exceeded the frame limit "
                f"({exc.reason}); one frame carries a whole batch (every slot's observation or action, the "
                "contract's bounds): fewer slots per sim (sim.num_envs), a spawned sim's slots split over processes "
                "(sim.shards: a frame each), smaller observations, or a larger limit (a spawned sim's "
                "sim.max_frame_mb, a served sim's --max-frame-bytes) fit"
            )
        if isinstance(exc, LinkClosed) and exc.code in _BROKEN_PROTOCOL_CODES:  # alive: one side refused the bytes
            refused = "this client refused a frame from the sim" if exc.refused_here else "the sim refused a frame"
            return SimError(
                f"the connection to the sim at {self.url} closed during {phase}: {refused} that broke the WebSocket "
                f"protocol ({exc}); the sim did not go away: something between the two sides (a proxy, a load "
                "balancer) altered the bytes, or the other side is not a hud-pipelines sim"
            )
        code = f" (close code {exc.code})" if isinstance(exc, LinkClosed) and exc.code is not None else ""
        shut = isinstance(exc, RemoteError) or (isinstance(exc, LinkClosed) and exc.code == CloseCode.GOING_AWAY)
        said = exc.message if isinstance(exc, RemoteError) else str(exc)
        diagnosis = self._diagnosis()
        return SimCrashedError(
            f"the sim at {self.url} {'shut down' if shut else 'went away'} during {phase}{code}: {said}{diagnosis}",
            returncode=self._exit_status(),
        )

    def _diagnosis(self) -> str:
        text = self._diagnose()
        return f"\n{text}" if text else ""
